package proc

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// openPTY opens a pseudo-terminal pair through /dev/ptmx, without cgo: the
// master stays in the agent, the slave becomes the process's terminal.
func openPTY() (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("opening /dev/ptmx (does the sandbox mount devpts?): %w", err)
	}
	var unlock int32
	if err := ioctl(master, syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("unlocking the PTY: %w", err)
	}
	var n uint32
	if err := ioctl(master, syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("finding the PTY's number: %w", err)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("opening the PTY's terminal: %w", err)
	}
	return master, slave, nil
}

type winsize struct {
	Rows, Cols, X, Y uint16
}

// resize sets the terminal's size.
func resize(master *os.File, size *PTYSize) error {
	if size == nil || size.Cols == 0 || size.Rows == 0 {
		return nil
	}
	ws := winsize{Rows: uint16(size.Rows), Cols: uint16(size.Cols)}
	return ioctl(master, syscall.TIOCSWINSZ, uintptr(unsafe.Pointer(&ws)))
}

// ioctl runs one ioctl on a file without putting it in blocking mode (which
// f.Fd() would, and a blocked read then could not be interrupted by Close).
func ioctl(f *os.File, req, arg uintptr) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno syscall.Errno
	if err := raw.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, req, arg)
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}
