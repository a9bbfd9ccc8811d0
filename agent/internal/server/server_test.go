package server

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"warren.dev/agent/internal/identity"
)

const token = "test-token"

type agent struct {
	t    *testing.T
	url  string
	home string
}

func start(t *testing.T) *agent {
	t.Helper()
	home := t.TempDir()
	self, err := identity.Self()
	if err != nil {
		t.Fatal(err)
	}
	self.Home = home
	srv := httptest.NewServer(New(Config{AccessToken: token, Self: self}))
	t.Cleanup(srv.Close)
	return &agent{t: t, url: srv.URL, home: home}
}

func (a *agent) do(method, path, contentType string, body []byte, withToken bool) *http.Response {
	a.t.Helper()
	req, err := http.NewRequest(method, a.url+path, bytes.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if withToken {
		req.Header.Set(TokenHeader, token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(func() { res.Body.Close() })
	return res
}

// unary makes a Connect unary call and decodes the answer (or the error body).
func (a *agent) unary(method string, req any, into any) int {
	a.t.Helper()
	body, _ := json.Marshal(req)
	res := a.do(http.MethodPost, "/"+method, "application/json", body, true)
	if err := json.NewDecoder(res.Body).Decode(into); err != nil {
		a.t.Fatalf("%s: decoding the answer: %v", method, err)
	}
	return res.StatusCode
}

type event struct {
	Event struct {
		Start *struct{ Pid uint32 }
		Data  *struct{ Stdout, Stderr, Pty []byte }
		End   *struct {
			ExitCode int32
			Exited   bool
			Status   string
			Error    *string
		}
	}
	Error *struct{ Code, Message string }
}

// stream opens a server-streaming call and returns a reader of its envelopes.
func (a *agent) stream(method string, req any) func() (byte, *event) {
	a.t.Helper()
	payload, _ := json.Marshal(req)
	body := make([]byte, 5, 5+len(payload))
	binary.BigEndian.PutUint32(body[1:], uint32(len(payload)))
	res := a.do(http.MethodPost, "/"+method, "application/connect+json", append(body, payload...), true)
	if res.StatusCode != 200 {
		a.t.Fatalf("%s: status %d", method, res.StatusCode)
	}
	return func() (byte, *event) {
		var head [5]byte
		if _, err := io.ReadFull(res.Body, head[:]); err != nil {
			a.t.Fatalf("%s: the stream ended without an end-of-stream envelope: %v", method, err)
		}
		msg := make([]byte, binary.BigEndian.Uint32(head[1:]))
		if _, err := io.ReadFull(res.Body, msg); err != nil {
			a.t.Fatal(err)
		}
		ev := &event{}
		if err := json.Unmarshal(msg, ev); err != nil {
			a.t.Fatalf("decoding %s: %v", msg, err)
		}
		return head[0], ev
	}
}

// collect reads a process stream to its end.
func collect(t *testing.T, next func() (byte, *event)) (pid uint32, stdout, stderr string, end *event) {
	t.Helper()
	for {
		flags, ev := next()
		if flags&0x02 != 0 {
			if ev.Error != nil {
				t.Fatalf("the stream ended with %s: %s", ev.Error.Code, ev.Error.Message)
			}
			return pid, stdout, stderr, end
		}
		switch e := ev.Event; {
		case e.Start != nil:
			pid = e.Start.Pid
		case e.Data != nil:
			stdout += string(e.Data.Stdout) + string(e.Data.Pty)
			stderr += string(e.Data.Stderr)
		case e.End != nil:
			end = ev
		}
	}
}

func TestHealthIsOpenAndEverythingElseNeedsTheToken(t *testing.T) {
	a := start(t)
	if res := a.do(http.MethodGet, "/health", "", nil, false); res.StatusCode != http.StatusNoContent {
		t.Fatalf("/health: %d, want 204", res.StatusCode)
	}
	rpcRes := a.do(http.MethodPost, "/process.Process/List", "application/json", []byte(`{}`), false)
	var rpcErr struct{ Code, Message string }
	_ = json.NewDecoder(rpcRes.Body).Decode(&rpcErr)
	if rpcRes.StatusCode != 401 || rpcErr.Code != "unauthenticated" || !strings.Contains(rpcErr.Message, TokenHeader) {
		t.Fatalf("List without the token: %d %+v", rpcRes.StatusCode, rpcErr)
	}
	filesRes := a.do(http.MethodGet, "/files?path=/etc/hostname", "", nil, false)
	var httpErr struct {
		Code    int
		Message string
	}
	_ = json.NewDecoder(filesRes.Body).Decode(&httpErr)
	if filesRes.StatusCode != 401 || httpErr.Code != 401 {
		t.Fatalf("/files without the token: %d %+v", filesRes.StatusCode, httpErr)
	}
	if res := a.do(http.MethodPost, "/process.Process/List", "application/json", []byte(`{}`), true); res.StatusCode != 200 {
		t.Fatalf("List with the token: %d", res.StatusCode)
	}
	if res := a.do(http.MethodPost, "/process.Process/Nope", "application/json", []byte(`{}`), true); res.StatusCode != 501 {
		t.Fatalf("an unknown method: %d, want 501 (unimplemented)", res.StatusCode)
	}
}

func TestStartStreamsOutputAndTheExitCode(t *testing.T) {
	a := start(t)
	next := a.stream("process.Process/Start", map[string]any{
		"process": map[string]any{
			"cmd": "/bin/sh", "args": []string{"-c", `echo "$GREETING from $(pwd)"; echo oops >&2; exit 3`},
			"envs": map[string]string{"GREETING": "hello"}, "cwd": a.home,
		},
		"stdin": false,
	})
	pid, stdout, stderr, end := collect(t, next)
	if pid == 0 {
		t.Fatal("no start event with a pid")
	}
	if stdout != "hello from "+a.home+"\n" || stderr != "oops\n" {
		t.Fatalf("stdout %q, stderr %q", stdout, stderr)
	}
	if end == nil || end.Event.End.ExitCode != 3 || !end.Event.End.Exited || end.Event.End.Status != "exit status 3" {
		t.Fatalf("end event %+v", end)
	}
}

func TestStdinListAndSignal(t *testing.T) {
	a := start(t)
	next := a.stream("process.Process/Start", map[string]any{
		"process": map[string]any{"cmd": "/bin/cat"}, "tag": "reader", "stdin": true,
	})
	_, first := next()
	pid := first.Event.Start.Pid

	var listed struct {
		Processes []struct {
			Pid    uint32
			Tag    string
			Config struct{ Cmd string }
		}
	}
	a.unary("process.Process/List", map[string]any{}, &listed)
	if len(listed.Processes) != 1 || listed.Processes[0].Pid != pid || listed.Processes[0].Tag != "reader" || listed.Processes[0].Config.Cmd != "/bin/cat" {
		t.Fatalf("List: %+v", listed)
	}

	byTag := map[string]any{"tag": "reader"}
	var empty map[string]any
	input := base64.StdEncoding.EncodeToString([]byte("echoed\n"))
	if code := a.unary("process.Process/SendInput", map[string]any{"process": byTag, "input": map[string]string{"stdin": input}}, &empty); code != 200 {
		t.Fatalf("SendInput: %d %v", code, empty)
	}
	if code := a.unary("process.Process/CloseStdin", map[string]any{"process": byTag}, &empty); code != 200 {
		t.Fatalf("CloseStdin: %d %v", code, empty)
	}
	_, stdout, _, end := collect(t, next)
	if stdout != "echoed\n" || end.Event.End.ExitCode != 0 {
		t.Fatalf("cat gave %q and %+v", stdout, end)
	}

	sleeper := a.stream("process.Process/Start", map[string]any{"process": map[string]any{"cmd": "sleep", "args": []string{"300"}}})
	_, first = sleeper()
	var errBody struct{ Code string }
	if code := a.unary("process.Process/SendSignal", map[string]any{"process": map[string]any{"pid": first.Event.Start.Pid}, "signal": "SIGNAL_SIGKILL"}, &errBody); code != 200 {
		t.Fatalf("SendSignal: %d %+v", code, errBody)
	}
	done := make(chan *event)
	go func() { _, _, _, end := collect(t, sleeper); done <- end }()
	select {
	case end := <-done:
		if end.Event.End.Exited || end.Event.End.Status != "signal: killed" || end.Event.End.Error == nil {
			t.Fatalf("a killed process ended with %+v", end.Event.End)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the killed process's stream did not end")
	}
	if code := a.unary("process.Process/SendSignal", map[string]any{"process": map[string]any{"pid": first.Event.Start.Pid}, "signal": "SIGNAL_SIGKILL"}, &errBody); code != 404 || errBody.Code != "not_found" {
		t.Fatalf("signalling an ended process: %d %+v, want 404 not_found", code, errBody)
	}
}

func TestFilesystemCalls(t *testing.T) {
	a := start(t)
	if err := os.MkdirAll(filepath.Join(a.home, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.home, "a", "b", "deep.txt"), []byte("123"), 0o600); err != nil {
		t.Fatal(err)
	}

	var stat struct {
		Entry struct {
			Name, Type, Path, Size, Permissions string
			Mode                                uint32
		}
	}
	a.unary("filesystem.Filesystem/Stat", map[string]string{"path": "a/b/deep.txt"}, &stat)
	if e := stat.Entry; e.Type != "FILE_TYPE_FILE" || e.Size != "3" || e.Mode != 0o600 || e.Path != filepath.Join(a.home, "a/b/deep.txt") || e.Permissions != "-rw-------" {
		t.Fatalf("Stat: %+v", e)
	}
	var errBody struct{ Code string }
	if code := a.unary("filesystem.Filesystem/Stat", map[string]string{"path": "/nonexistent/x"}, &errBody); code != 404 || errBody.Code != "not_found" {
		t.Fatalf("Stat of a missing path: %d %+v", code, errBody)
	}

	var list struct{ Entries []struct{ Path string } }
	a.unary("filesystem.Filesystem/ListDir", map[string]any{"path": a.home, "depth": 1}, &list)
	if len(list.Entries) != 1 || list.Entries[0].Path != filepath.Join(a.home, "a") {
		t.Fatalf("ListDir depth 1: %+v", list)
	}
	a.unary("filesystem.Filesystem/ListDir", map[string]any{"path": a.home, "depth": 3}, &list)
	if len(list.Entries) != 3 {
		t.Fatalf("ListDir depth 3: %+v", list)
	}

	var made map[string]any
	if code := a.unary("filesystem.Filesystem/MakeDir", map[string]string{"path": "x/y"}, &made); code != 200 {
		t.Fatalf("MakeDir: %d %v", code, made)
	}
	if code := a.unary("filesystem.Filesystem/MakeDir", map[string]string{"path": "x/y"}, &errBody); code != 409 || errBody.Code != "already_exists" {
		t.Fatalf("MakeDir again: %d %+v", code, errBody)
	}
	if code := a.unary("filesystem.Filesystem/Move", map[string]string{"source": "a", "destination": "x/y/a"}, &made); code != 200 {
		t.Fatalf("Move: %d %v", code, made)
	}
	if _, err := os.Stat(filepath.Join(a.home, "x/y/a/b/deep.txt")); err != nil {
		t.Fatalf("after Move: %v", err)
	}
	if code := a.unary("filesystem.Filesystem/Remove", map[string]string{"path": "x"}, &made); code != 200 {
		t.Fatalf("Remove: %d %v", code, made)
	}
	if _, err := os.Stat(filepath.Join(a.home, "x")); !os.IsNotExist(err) {
		t.Fatalf("after Remove: %v", err)
	}
}

func TestUploadAndDownload(t *testing.T) {
	a := start(t)
	var body bytes.Buffer
	form := multipart.NewWriter(&body)
	for name, data := range map[string]string{"one/1.txt": "first", filepath.Join(a.home, "two", "2.bin"): "\x00second"} {
		part, err := form.CreateFormFile("file", name)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = part.Write([]byte(data))
	}
	_ = form.Close()
	res := a.do(http.MethodPost, "/files", form.FormDataContentType(), body.Bytes(), true)
	var written []struct{ Name, Type, Path string }
	if err := json.NewDecoder(res.Body).Decode(&written); err != nil || res.StatusCode != 200 || len(written) != 2 {
		t.Fatalf("upload: %d %+v %v", res.StatusCode, written, err)
	}
	for path, want := range map[string]string{"one/1.txt": "first", "two/2.bin": "\x00second"} {
		got, err := os.ReadFile(filepath.Join(a.home, path))
		if err != nil || string(got) != want {
			t.Fatalf("%s holds %q (%v), want %q: a part's filename is its whole path", path, got, err, want)
		}
	}

	res = a.do(http.MethodPost, "/files?path=three.txt", "application/octet-stream", []byte("raw"), true)
	if res.StatusCode != 200 {
		t.Fatalf("octet-stream upload: %d", res.StatusCode)
	}
	res = a.do(http.MethodGet, "/files?path=three.txt", "", nil, true)
	got, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 || string(got) != "raw" {
		t.Fatalf("download: %d %q", res.StatusCode, got)
	}
	if res := a.do(http.MethodGet, "/files?path=missing.txt", "", nil, true); res.StatusCode != 404 {
		t.Fatalf("download of a missing file: %d, want 404", res.StatusCode)
	}
	if res := a.do(http.MethodGet, "/files?path=one", "", nil, true); res.StatusCode != 400 {
		t.Fatalf("download of a directory: %d, want 400", res.StatusCode)
	}
}

func TestPTYStartInputAndResize(t *testing.T) {
	a := start(t)
	next := a.stream("process.Process/Start", map[string]any{
		"process": map[string]any{"cmd": "/bin/sh", "args": []string{"-c", "read line; stty size; tty; echo got $line"}},
		"pty":     map[string]any{"size": map[string]int{"rows": 24, "cols": 80}},
	})
	_, first := next()
	pid := first.Event.Start.Pid
	sel := map[string]any{"pid": pid}
	var body map[string]any
	if code := a.unary("process.Process/Update", map[string]any{"process": sel, "pty": map[string]any{"size": map[string]int{"rows": 50, "cols": 132}}}, &body); code != 200 {
		t.Fatalf("Update: %d %v", code, body)
	}
	input := base64.StdEncoding.EncodeToString([]byte("typed\n"))
	if code := a.unary("process.Process/SendInput", map[string]any{"process": sel, "input": map[string]string{"pty": input}}, &body); code != 200 {
		t.Fatalf("SendInput: %d %v", code, body)
	}
	_, out, _, end := collect(t, next)
	for _, want := range []string{"50 132", "/dev/pts/", "got typed"} {
		if !strings.Contains(out, want) {
			t.Fatalf("terminal output %q lacks %q", out, want)
		}
	}
	if end.Event.End.ExitCode != 0 {
		t.Fatalf("end %+v", end.Event.End)
	}

	plain := a.stream("process.Process/Start", map[string]any{"process": map[string]any{"cmd": "sleep", "args": []string{"5"}}})
	_, first = plain()
	var errBody struct{ Code string }
	if code := a.unary("process.Process/Update", map[string]any{"process": map[string]any{"pid": first.Event.Start.Pid}, "pty": map[string]any{"size": map[string]int{"rows": 1, "cols": 1}}}, &errBody); code != 400 || errBody.Code != "failed_precondition" {
		t.Fatalf("resizing a process without a terminal: %d %+v", code, errBody)
	}
	a.unary("process.Process/SendSignal", map[string]any{"process": map[string]any{"pid": first.Event.Start.Pid}, "signal": "SIGNAL_SIGTERM"}, &body)
}

func TestWatcherCalls(t *testing.T) {
	a := start(t)
	var created struct{ WatcherId string }
	if code := a.unary("filesystem.Filesystem/CreateWatcher", map[string]any{"path": a.home, "recursive": true}, &created); code != 200 || created.WatcherId == "" {
		t.Fatalf("CreateWatcher: %d %+v", code, created)
	}
	if err := os.WriteFile(filepath.Join(a.home, "f.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(a.home, "f.txt")); err != nil {
		t.Fatal(err)
	}
	var got []string
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < 3 && time.Now().Before(deadline) {
		var events struct{ Events []struct{ Name, Type string } }
		a.unary("filesystem.Filesystem/GetWatcherEvents", map[string]string{"watcherId": created.WatcherId}, &events)
		for _, e := range events.Events {
			got = append(got, e.Name+" "+e.Type)
		}
		time.Sleep(20 * time.Millisecond)
	}
	want := []string{"f.txt EVENT_TYPE_CREATE", "f.txt EVENT_TYPE_WRITE", "f.txt EVENT_TYPE_REMOVE"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("events %q, want %q", got, want)
	}
	var body map[string]any
	if code := a.unary("filesystem.Filesystem/RemoveWatcher", map[string]string{"watcherId": created.WatcherId}, &body); code != 200 {
		t.Fatalf("RemoveWatcher: %d %v", code, body)
	}
	var errBody struct{ Code string }
	if code := a.unary("filesystem.Filesystem/GetWatcherEvents", map[string]string{"watcherId": created.WatcherId}, &errBody); code != 404 || errBody.Code != "not_found" {
		t.Fatalf("a removed watcher: %d %+v", code, errBody)
	}
	if code := a.unary("filesystem.Filesystem/CreateWatcher", map[string]any{"path": filepath.Join(a.home, "missing")}, &errBody); code != 404 {
		t.Fatalf("watching a missing directory: %d %+v", code, errBody)
	}
}

func TestABackgroundChildDoesNotHoldTheEndBack(t *testing.T) {
	a := start(t)
	began := time.Now()
	next := a.stream("process.Process/Start", map[string]any{
		"process": map[string]any{"cmd": "/bin/sh", "args": []string{"-c", "sleep 8 & echo started"}},
	})
	_, stdout, _, end := collect(t, next)
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("the end event took %s: a background child holding the output pipe held it back", took)
	}
	if stdout != "started\n" || end == nil || end.Event.End.ExitCode != 0 {
		t.Fatalf("stdout %q, end %+v", stdout, end)
	}
}

func TestUploadMetadataIsKeptAndStatShowsIt(t *testing.T) {
	a := start(t)
	req, _ := http.NewRequest(http.MethodPost, a.url+"/files?path=tagged.txt", strings.NewReader("x"))
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set(TokenHeader, token)
	req.Header.Set("X-Metadata-Owner", "bob")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var written []struct{ Metadata map[string]string }
	if err := json.NewDecoder(res.Body).Decode(&written); err != nil || res.StatusCode != 200 || written[0].Metadata["owner"] != "bob" {
		t.Fatalf("upload with metadata: %d %+v %v", res.StatusCode, written, err)
	}
	var stat struct {
		Entry struct{ Metadata map[string]string }
	}
	a.unary("filesystem.Filesystem/Stat", map[string]string{"path": "tagged.txt"}, &stat)
	if len(stat.Entry.Metadata) != 1 || stat.Entry.Metadata["owner"] != "bob" {
		t.Fatalf("Stat metadata: %+v", stat.Entry.Metadata)
	}
}

func TestATokenNamedByItsHashIsRequiredTheSameWay(t *testing.T) {
	self, err := identity.Self()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(token))
	srv := httptest.NewServer(New(Config{AccessTokenSHA256: hex.EncodeToString(sum[:]), Self: self}))
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		sent string
		want int
	}{
		{token, http.StatusOK},
		{"", http.StatusUnauthorized},
		{token + "x", http.StatusUnauthorized},
		{hex.EncodeToString(sum[:]), http.StatusUnauthorized}, // the hash is not the token
	} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/process.Process/List", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		if tc.sent != "" {
			req.Header.Set(TokenHeader, tc.sent)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != tc.want {
			t.Errorf("token %q: %d, want %d", tc.sent, res.StatusCode, tc.want)
		}
	}
}
