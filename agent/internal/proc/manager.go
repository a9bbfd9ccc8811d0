// Package proc runs the processes of envd's process.Process service: each one
// started with pipes for its output (and its stdin when asked), its output fanned
// out to every stream attached to it (the Start call's and any Connect calls'),
// kept in a table by pid and tag until it ends.
package proc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"sync"
	"syscall"
	"time"

	"warren.dev/agent/internal/identity"
	"warren.dev/agent/internal/rpc"
)

// outputGrace is how long output is still read after a process exits, for
// output its children wrote; a child that keeps the pipe open past it (a
// daemon started in the background) does not hold the end event back.
const outputGrace = 2 * time.Second

// chunkSize bounds one data event.
const chunkSize = 32 << 10

// subscriber is one stream attached to a process.
type subscriber struct {
	events chan *ProcessEvent // closed after the end event
	gone   chan struct{}      // closed when the stream's client leaves
}

// Process is one running process.
type Process struct {
	Pid    uint32
	Config ProcessConfig
	Tag    *string

	cmd     *exec.Cmd
	stdinMu sync.Mutex
	stdin   io.WriteCloser // nil: started without stdin, or closed
	pty     *os.File       // the terminal's master side, for a process started with a PTY

	mu   sync.Mutex
	subs map[*subscriber]struct{}
	end  *ProcessEvent // set once the process has ended and its output is read

	forgotten chan struct{} // closed once the manager no longer lists the process
}

// Manager is the table of running processes.
type Manager struct {
	mu    sync.Mutex
	procs map[uint32]*Process
}

func NewManager() *Manager { return &Manager{procs: map[uint32]*Process{}} }

// Start starts a process and attaches a first subscriber before any output exists.
func (m *Manager) Start(req *StartRequest, user *identity.User) (*Process, *subscriber, error) {
	if req.Process == nil || req.Process.Cmd == "" {
		return nil, nil, rpc.Errorf(rpc.InvalidArgument, "process.cmd is empty: name the program to run")
	}
	if req.Tag != nil {
		if _, err := m.find(&ProcessSelector{Tag: req.Tag}); err == nil {
			return nil, nil, rpc.Errorf(rpc.AlreadyExists, "a process with tag %q is running: choose another tag", *req.Tag)
		}
	}
	cfg := *req.Process
	dir := user.Home
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		dir = "/" // a user without a home directory (nobody's is /nonexistent) starts at the root
	}
	if cfg.Cwd != nil && *cfg.Cwd != "" {
		d, err := user.Resolve(*cfg.Cwd)
		if err != nil {
			return nil, nil, err
		}
		dir = d
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, nil, rpc.Errorf(rpc.InvalidArgument, "the working directory %s is not a directory: create it or pick another cwd", dir)
	}

	cmd := exec.Command(cfg.Cmd, cfg.Args...)
	cmd.Dir = dir
	cmd.Env = environment(user, cfg.Envs)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: user.Credential()}

	p := &Process{Config: cfg, Tag: req.Tag, cmd: cmd, subs: map[*subscriber]struct{}{}, forgotten: make(chan struct{})}
	var out *outputs
	var err error
	if req.PTY != nil {
		out, err = p.attachPTY(req.PTY, user)
	} else {
		out, err = p.attachPipes(req.Stdin == nil || *req.Stdin) // unset means true, as envd keeps it for old SDKs
	}
	if err != nil {
		return nil, nil, err
	}
	sub := p.subscribe()
	if err := cmd.Start(); err != nil {
		out.closeAll()
		return nil, nil, rpc.Errorf(rpc.InvalidArgument, "starting %s: %v", cfg.Cmd, err)
	}
	for _, f := range out.childEnds {
		f.Close()
	}
	p.Pid = uint32(cmd.Process.Pid)

	m.mu.Lock()
	m.procs[p.Pid] = p
	m.mu.Unlock()
	go m.reap(p, out)
	return p, sub, nil
}

// outputs is what the agent reads from a process and what it hands the child.
type outputs struct {
	files     []*os.File // stdout and stderr, or the terminal
	wraps     []func([]byte) *DataEvent
	childEnds []*os.File // closed in the agent once the child has them
}

func (o *outputs) closeAll() {
	for _, f := range append(o.files, o.childEnds...) {
		f.Close()
	}
}

// attachPTY gives the process a terminal of its own: a session of its own with
// the terminal as its controlling one (and so its own process group, which
// signals go to).
func (p *Process) attachPTY(pty *PTY, user *identity.User) (*outputs, error) {
	master, slave, err := openPTY()
	if err != nil {
		return nil, err
	}
	if err := resize(master, pty.Size); err != nil {
		master.Close()
		slave.Close()
		return nil, fmt.Errorf("sizing the PTY: %w", err)
	}
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = slave, slave, slave
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Credential: user.Credential()}
	p.pty = master
	return &outputs{
		files:     []*os.File{master},
		wraps:     []func([]byte) *DataEvent{func(b []byte) *DataEvent { return &DataEvent{PTY: b} }},
		childEnds: []*os.File{slave},
	}, nil
}

// attachPipes gives the process pipes for stdout and stderr, and for stdin when asked.
func (p *Process) attachPipes(stdin bool) (*outputs, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("making the stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("making the stderr pipe: %w", err)
	}
	o := &outputs{
		files: []*os.File{outR, errR},
		wraps: []func([]byte) *DataEvent{
			func(b []byte) *DataEvent { return &DataEvent{Stdout: b} },
			func(b []byte) *DataEvent { return &DataEvent{Stderr: b} },
		},
		childEnds: []*os.File{outW, errW},
	}
	p.cmd.Stdout, p.cmd.Stderr = outW, errW
	if stdin {
		if p.stdin, err = p.cmd.StdinPipe(); err != nil {
			o.closeAll()
			return nil, fmt.Errorf("making the stdin pipe: %w", err)
		}
	}
	return o, nil
}

// reap streams the process's output until it has exited and its output is read
// (or outputGrace after its exit), then forgets it and sends its end event.
func (m *Manager) reap(p *Process, o *outputs) {
	var readers sync.WaitGroup
	readers.Add(len(o.files))
	for i, f := range o.files {
		go p.pump(f, o.wraps[i], &readers)
	}
	waitErr := p.cmd.Wait()
	drained := make(chan struct{})
	go func() { readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(outputGrace):
		for _, f := range o.files {
			f.Close()
		}
		<-drained
	}
	m.mu.Lock()
	delete(m.procs, p.Pid)
	m.mu.Unlock()
	close(p.forgotten)
	p.finish(endEvent(p.cmd.ProcessState, waitErr))
}

// environment is the agent's environment, the user's HOME/USER/LOGNAME, then the call's envs.
func environment(user *identity.User, envs map[string]string) []string {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		for i := 0; i < len(kv); i++ {
			if kv[i] == '=' {
				env[kv[:i]] = kv[i+1:]
				break
			}
		}
	}
	env["HOME"], env["USER"], env["LOGNAME"] = user.Home, user.Name, user.Name
	if env["PATH"] == "" {
		env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	for k, v := range envs {
		env[k] = v
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, k+"="+env[k])
	}
	return out
}

func endEvent(state *os.ProcessState, waitErr error) *EndEvent {
	end := &EndEvent{ExitCode: -1}
	if state != nil {
		end.ExitCode = int32(state.ExitCode())
		end.Exited = state.Exited()
		end.Status = state.String()
	}
	var exitErr *exec.ExitError
	switch {
	case waitErr != nil && !errors.As(waitErr, &exitErr):
		msg := waitErr.Error()
		end.Error = &msg
	case state != nil && !state.Exited():
		msg := state.String() // "signal: killed": the SDK shows it as the error
		end.Error = &msg
	}
	return end
}

func (p *Process) pump(r *os.File, wrap func([]byte) *DataEvent, done *sync.WaitGroup) {
	defer done.Done()
	defer r.Close()
	buf := make([]byte, chunkSize)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			chunk := make([]byte, n)
			copy(chunk, buf[:n])
			p.broadcast(&ProcessEvent{Data: wrap(chunk)})
		}
		if err != nil {
			return
		}
	}
}

func (p *Process) subscribe() *subscriber {
	s := &subscriber{events: make(chan *ProcessEvent, 64), gone: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil { // too late for output: the end alone
		s.events <- p.end
		close(s.events)
		return s
	}
	p.subs[s] = struct{}{}
	return s
}

// Leave detaches a subscriber whose client went away.
func (p *Process) leave(s *subscriber) {
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
	close(s.gone)
}

func (p *Process) snapshot() []*subscriber {
	p.mu.Lock()
	defer p.mu.Unlock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	return subs
}

// broadcast hands an event to every subscriber, waiting for slow ones (the
// process then waits on its pipe) but never for one whose client has left.
func (p *Process) broadcast(ev *ProcessEvent) {
	for _, s := range p.snapshot() {
		select {
		case s.events <- ev:
		case <-s.gone:
		}
	}
}

// finish sends the end event to every subscriber and closes their streams;
// one that subscribes later gets the end event alone.
func (p *Process) finish(end *EndEvent) {
	ev := &ProcessEvent{End: end}
	p.mu.Lock()
	p.end = ev
	subs := p.subs
	p.subs = map[*subscriber]struct{}{}
	p.mu.Unlock()
	for s := range subs {
		select {
		case s.events <- ev:
		case <-s.gone:
		}
		close(s.events)
	}
}

// Info is the process's entry in List.
func (p *Process) Info() ProcessInfo {
	cfg := p.Config
	return ProcessInfo{Config: &cfg, Pid: p.Pid, Tag: p.Tag}
}

func (m *Manager) find(sel *ProcessSelector) (*Process, error) {
	if sel == nil || (sel.Pid == nil && sel.Tag == nil) {
		return nil, rpc.Errorf(rpc.InvalidArgument, "process selector is empty: give a pid or a tag")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if sel.Pid != nil {
		if p, ok := m.procs[uint32(*sel.Pid)]; ok {
			return p, nil
		}
		return nil, rpc.Errorf(rpc.NotFound, "process with pid %d not found: it has ended or was never started by this agent", *sel.Pid)
	}
	for _, p := range m.procs {
		if p.Tag != nil && *p.Tag == *sel.Tag {
			return p, nil
		}
	}
	return nil, rpc.Errorf(rpc.NotFound, "process with tag %q not found: it has ended or was never started by this agent", *sel.Tag)
}

// List returns the running processes, by pid.
func (m *Manager) List() []ProcessInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]ProcessInfo, 0, len(m.procs))
	for _, p := range m.procs {
		out = append(out, p.Info())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pid < out[j].Pid })
	return out
}

// Signal sends SIGTERM or SIGKILL to the process's group (its children too).
func (m *Manager) Signal(sel *ProcessSelector, sig Signal) error {
	p, err := m.find(sel)
	if err != nil {
		return err
	}
	var s syscall.Signal
	switch sig {
	case SignalSIGKILL:
		s = syscall.SIGKILL
	case SignalSIGTERM:
		s = syscall.SIGTERM
	default:
		return rpc.Errorf(rpc.InvalidArgument, "signal %d is not supported: send SIGNAL_SIGTERM or SIGNAL_SIGKILL", sig)
	}
	if err := syscall.Kill(-int(p.Pid), s); err != nil {
		if err := syscall.Kill(int(p.Pid), s); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("signalling pid %d: %w", p.Pid, err)
		}
	}
	if s == syscall.SIGKILL {
		// A killed process cannot linger: answer once it is reaped and off the list, so a
		// List right after the kill no longer shows it. Bounded by the output grace.
		select {
		case <-p.forgotten:
		case <-time.After(outputGrace + time.Second):
		}
	}
	return nil
}

// WriteStdin writes to the process's stdin, or to its terminal when it has one.
func (m *Manager) WriteStdin(sel *ProcessSelector, data []byte) error {
	p, err := m.find(sel)
	if err != nil {
		return err
	}
	if p.pty != nil {
		if _, err := p.pty.Write(data); err != nil {
			return rpc.Errorf(rpc.FailedPrecondition, "writing to the terminal of process %d: %v", p.Pid, err)
		}
		return nil
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return rpc.Errorf(rpc.FailedPrecondition, "process %d has no open stdin: start it with stdin enabled and do not close it first", p.Pid)
	}
	if _, err := p.stdin.Write(data); err != nil {
		return rpc.Errorf(rpc.FailedPrecondition, "writing to the stdin of process %d: %v", p.Pid, err)
	}
	return nil
}

// CloseStdin closes the process's stdin (EOF for the process).
func (m *Manager) CloseStdin(sel *ProcessSelector) error {
	p, err := m.find(sel)
	if err != nil {
		return err
	}
	if p.pty != nil {
		return rpc.Errorf(rpc.FailedPrecondition, "process %d reads a terminal, not a pipe: send Ctrl-D (\\x04) as its input to end it", p.Pid)
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return nil
	}
	err = p.stdin.Close()
	p.stdin = nil
	return err
}

// Attach subscribes to a running process's events from now on.
func (m *Manager) Attach(sel *ProcessSelector) (*Process, *subscriber, error) {
	p, err := m.find(sel)
	if err != nil {
		return nil, nil, err
	}
	return p, p.subscribe(), nil
}

// Resize sets the size of a process's terminal.
func (m *Manager) Resize(sel *ProcessSelector, pty *PTY) error {
	p, err := m.find(sel)
	if err != nil {
		return err
	}
	if p.pty == nil {
		return rpc.Errorf(rpc.FailedPrecondition, "process %d has no terminal to resize: start it with a PTY", p.Pid)
	}
	if pty == nil || pty.Size == nil {
		return rpc.Errorf(rpc.InvalidArgument, "pty.size is missing: give the rows and cols")
	}
	if err := resize(p.pty, pty.Size); err != nil {
		return fmt.Errorf("resizing the terminal of process %d: %w", p.Pid, err)
	}
	return nil
}
