package fsys

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"warren.dev/agent/internal/rpc"
)

// EventType is the filesystem.EventType enum.
type EventType int32

const (
	EventCreate EventType = 1
	EventWrite  EventType = 2
	EventRemove EventType = 3
	EventRename EventType = 4
	EventChmod  EventType = 5
)

var eventTypeNames = []string{"EVENT_TYPE_UNSPECIFIED", "EVENT_TYPE_CREATE", "EVENT_TYPE_WRITE", "EVENT_TYPE_REMOVE", "EVENT_TYPE_RENAME", "EVENT_TYPE_CHMOD"}

func (t EventType) MarshalJSON() ([]byte, error) {
	if t >= 0 && int(t) < len(eventTypeNames) {
		return json.Marshal(eventTypeNames[t])
	}
	return json.Marshal(int32(t))
}

type FilesystemEvent struct {
	Name  string     `json:"name"`
	Type  EventType  `json:"type"`
	Entry *EntryInfo `json:"entry,omitempty"`
}

type WatchDirRequest struct {
	Path               string `json:"path"`
	Recursive          bool   `json:"recursive"`
	IncludeEntry       bool   `json:"includeEntry"`
	AllowNetworkMounts bool   `json:"allowNetworkMounts"`
}

type WatchDirResponse struct {
	Start      *struct{}        `json:"start,omitempty"`
	Filesystem *FilesystemEvent `json:"filesystem,omitempty"`
	KeepAlive  *struct{}        `json:"keepalive,omitempty"`
}

type CreateWatcherResponse struct {
	WatcherID string `json:"watcherId"`
}

type WatcherRequest struct {
	WatcherID string `json:"watcherId"`
}

type GetWatcherEventsResponse struct {
	Events []FilesystemEvent `json:"events"`
}

type RemoveWatcherResponse struct{}

// inotifyMask is what a watch asks the kernel for.
const inotifyMask = syscall.IN_CREATE | syscall.IN_MODIFY | syscall.IN_DELETE | syscall.IN_MOVED_FROM |
	syscall.IN_MOVED_TO | syscall.IN_ATTRIB | syscall.IN_DELETE_SELF | syscall.IN_MOVE_SELF

// eventType maps an inotify mask to the protocol's event (0: none).
func eventType(mask uint32) EventType {
	switch {
	case mask&(syscall.IN_CREATE|syscall.IN_MOVED_TO) != 0:
		return EventCreate
	case mask&syscall.IN_MODIFY != 0:
		return EventWrite
	case mask&(syscall.IN_DELETE|syscall.IN_DELETE_SELF) != 0:
		return EventRemove
	case mask&(syscall.IN_MOVED_FROM|syscall.IN_MOVE_SELF) != 0:
		return EventRename
	case mask&syscall.IN_ATTRIB != 0:
		return EventChmod
	}
	return 0
}

// watcher follows one directory (and, when recursive, every directory under it)
// with inotify and hands each event to emit, names relative to the root.
type watcher struct {
	root         string
	recursive    bool
	includeEntry bool
	file         *os.File // the inotify descriptor, non-blocking under Go's poller

	mu   sync.Mutex
	dirs map[int32]string // watch descriptor -> directory
	// for watchers polled with GetWatcherEvents
	pending []FilesystemEvent
}

func newWatcher(root string, recursive, includeEntry bool) (*watcher, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, statError(root, err)
	}
	if !fi.IsDir() {
		return nil, rpc.Errorf(rpc.InvalidArgument, "%s is not a directory: watch a directory", root)
	}
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC | syscall.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("starting inotify (is the per-user limit of instances reached?): %w", err)
	}
	w := &watcher{root: root, recursive: recursive, includeEntry: includeEntry,
		file: os.NewFile(uintptr(fd), "inotify"), dirs: map[int32]string{}}
	if err := w.add(root, nil); err != nil {
		w.file.Close()
		return nil, err
	}
	return w, nil
}

// add watches a directory and, when recursive, the directories under it;
// found is told every entry under dir (nil: not wanted).
func (w *watcher) add(dir string, found func(path string)) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == dir {
				return statError(path, err)
			}
			return nil // gone or unreadable meanwhile: not watched
		}
		if path != dir && found != nil {
			found(path)
		}
		if !d.IsDir() {
			return nil
		}
		raw, err := w.file.SyscallConn()
		if err != nil {
			return err
		}
		var wd int
		var addErr error
		_ = raw.Control(func(fd uintptr) { wd, addErr = syscall.InotifyAddWatch(int(fd), path, inotifyMask) })
		if addErr != nil {
			if path == dir {
				return fmt.Errorf("watching %s (is fs.inotify.max_user_watches reached?): %w", path, addErr)
			}
			return nil
		}
		w.mu.Lock()
		w.dirs[int32(wd)] = path
		w.mu.Unlock()
		if !w.recursive {
			return filepath.SkipDir
		}
		return nil
	})
}

// run reads events until the watcher is closed.
func (w *watcher) run(emit func(FilesystemEvent)) {
	buf := make([]byte, 64<<10)
	for {
		n, err := w.file.Read(buf)
		if err != nil {
			return // closed
		}
		for off := 0; off+syscall.SizeofInotifyEvent <= n; {
			raw := (*syscall.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+syscall.SizeofInotifyEvent : off+syscall.SizeofInotifyEvent+int(raw.Len)]
			off += syscall.SizeofInotifyEvent + int(raw.Len)
			w.mu.Lock()
			dir, ok := w.dirs[raw.Wd]
			if raw.Mask&syscall.IN_IGNORED != 0 {
				delete(w.dirs, raw.Wd)
			}
			w.mu.Unlock()
			if !ok {
				continue
			}
			path := filepath.Join(dir, string(bytes.TrimRight(nameBytes, "\x00")))
			if raw.Mask&(syscall.IN_DELETE_SELF|syscall.IN_MOVE_SELF) != 0 && dir != w.root {
				continue // a subdirectory's own removal also arrives from its parent
			}
			typ := eventType(raw.Mask)
			if typ != 0 {
				emit(w.event(path, typ))
			}
			if w.recursive && raw.Mask&syscall.IN_ISDIR != 0 && raw.Mask&(syscall.IN_CREATE|syscall.IN_MOVED_TO) != 0 {
				// What was made in the new directory before its watch began is
				// reported as created (what is made after may be reported twice).
				_ = w.add(path, func(inner string) { emit(w.event(inner, EventCreate)) })
			}
		}
	}
}

// event names a path relative to the root and adds its entry when asked.
func (w *watcher) event(path string, typ EventType) FilesystemEvent {
	name, err := filepath.Rel(w.root, path)
	if err != nil {
		name = path
	}
	ev := FilesystemEvent{Name: name, Type: typ}
	if w.includeEntry && typ != EventRemove && typ != EventRename {
		if e, err := entry(path); err == nil {
			ev.Entry = e
		}
	}
	return ev
}

func (w *watcher) close() { w.file.Close() }

// watchers is the table of watchers polled with GetWatcherEvents.
type watchers struct {
	mu   sync.Mutex
	byID map[string]*watcher
}

func (s *Service) watchDir(ctx context.Context, r *http.Request, req *WatchDirRequest, st *rpc.Stream[WatchDirResponse]) error {
	_, root, err := s.resolve(r, req.Path)
	if err != nil {
		return err
	}
	w, err := newWatcher(root, req.Recursive, req.IncludeEntry)
	if err != nil {
		return err
	}
	defer w.close()
	events := make(chan FilesystemEvent, 256)
	go func() {
		defer close(events)
		w.run(func(ev FilesystemEvent) {
			select {
			case events <- ev:
			case <-ctx.Done():
			}
		})
	}()
	if err := st.Send(&WatchDirResponse{Start: &struct{}{}}); err != nil {
		return err
	}
	var tick <-chan time.Time
	if secs, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval")); err == nil && secs > 0 {
		t := time.NewTicker(time.Duration(secs) * time.Second)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return nil
			}
			if err := st.Send(&WatchDirResponse{Filesystem: &ev}); err != nil {
				return err
			}
		case <-tick:
			if err := st.Send(&WatchDirResponse{KeepAlive: &struct{}{}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (s *Service) createWatcher(_ context.Context, r *http.Request, req *WatchDirRequest) (*CreateWatcherResponse, error) {
	_, root, err := s.resolve(r, req.Path)
	if err != nil {
		return nil, err
	}
	w, err := newWatcher(root, req.Recursive, req.IncludeEntry)
	if err != nil {
		return nil, err
	}
	var id [12]byte
	if _, err := rand.Read(id[:]); err != nil {
		w.close()
		return nil, err
	}
	watcherID := hex.EncodeToString(id[:])
	s.watchers.mu.Lock()
	if s.watchers.byID == nil {
		s.watchers.byID = map[string]*watcher{}
	}
	s.watchers.byID[watcherID] = w
	s.watchers.mu.Unlock()
	go w.run(func(ev FilesystemEvent) {
		w.mu.Lock()
		w.pending = append(w.pending, ev)
		w.mu.Unlock()
	})
	return &CreateWatcherResponse{WatcherID: watcherID}, nil
}

func (s *Service) findWatcher(id string) (*watcher, error) {
	s.watchers.mu.Lock()
	defer s.watchers.mu.Unlock()
	w, ok := s.watchers.byID[id]
	if !ok {
		return nil, rpc.Errorf(rpc.NotFound, "watcher %q not found: it was removed or never created", id)
	}
	return w, nil
}

func (s *Service) getWatcherEvents(_ context.Context, _ *http.Request, req *WatcherRequest) (*GetWatcherEventsResponse, error) {
	w, err := s.findWatcher(req.WatcherID)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	events := w.pending
	w.pending = nil
	w.mu.Unlock()
	if events == nil {
		events = []FilesystemEvent{}
	}
	return &GetWatcherEventsResponse{Events: events}, nil
}

func (s *Service) removeWatcher(_ context.Context, _ *http.Request, req *WatcherRequest) (*RemoveWatcherResponse, error) {
	w, err := s.findWatcher(req.WatcherID)
	if err != nil {
		return nil, err
	}
	s.watchers.mu.Lock()
	delete(s.watchers.byID, req.WatcherID)
	s.watchers.mu.Unlock()
	w.close()
	return &RemoveWatcherResponse{}, nil
}
