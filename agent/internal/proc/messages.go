package proc

import (
	"encoding/json"

	"warren.dev/agent/internal/rpc"
)

// The messages of envd's process.Process service, in protobuf's JSON mapping
// (lowerCamel field names; bytes as base64, which encoding/json does for []byte).

type PTYSize struct {
	Cols rpc.Uint32 `json:"cols"`
	Rows rpc.Uint32 `json:"rows"`
}

type PTY struct {
	Size *PTYSize `json:"size,omitempty"`
}

type ProcessConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  *string           `json:"cwd,omitempty"`
}

type ProcessInfo struct {
	Config *ProcessConfig `json:"config,omitempty"`
	Pid    uint32         `json:"pid"`
	Tag    *string        `json:"tag,omitempty"`
}

type ListRequest struct{}

type ListResponse struct {
	Processes []ProcessInfo `json:"processes"`
}

type StartRequest struct {
	Process *ProcessConfig `json:"process"`
	PTY     *PTY           `json:"pty,omitempty"`
	Tag     *string        `json:"tag,omitempty"`
	Stdin   *bool          `json:"stdin,omitempty"`
}

// ProcessSelector picks a process by pid or by tag (a oneof).
type ProcessSelector struct {
	Pid *rpc.Uint32 `json:"pid,omitempty"`
	Tag *string     `json:"tag,omitempty"`
}

type StartEvent struct {
	Pid uint32 `json:"pid"`
}

// DataEvent carries one chunk of output (a oneof: exactly one is set).
type DataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	PTY    []byte `json:"pty,omitempty"`
}

type EndEvent struct {
	ExitCode int32   `json:"exitCode"`
	Exited   bool    `json:"exited"`
	Status   string  `json:"status"`
	Error    *string `json:"error,omitempty"`
}

type KeepAlive struct{}

// ProcessEvent is a oneof of start, data, end and keepalive.
type ProcessEvent struct {
	Start     *StartEvent `json:"start,omitempty"`
	Data      *DataEvent  `json:"data,omitempty"`
	End       *EndEvent   `json:"end,omitempty"`
	KeepAlive *KeepAlive  `json:"keepalive,omitempty"`
}

// StartResponse and ConnectResponse both wrap one event.
type StartResponse struct {
	Event *ProcessEvent `json:"event"`
}

type ConnectRequest struct {
	Process *ProcessSelector `json:"process"`
}

type UpdateRequest struct {
	Process *ProcessSelector `json:"process"`
	PTY     *PTY             `json:"pty,omitempty"`
}

type UpdateResponse struct{}

// ProcessInput is a oneof of stdin and pty bytes.
type ProcessInput struct {
	Stdin []byte `json:"stdin,omitempty"`
	PTY   []byte `json:"pty,omitempty"`
}

type SendInputRequest struct {
	Process *ProcessSelector `json:"process"`
	Input   *ProcessInput    `json:"input"`
}

type SendInputResponse struct{}

type StreamInputStart struct {
	Process *ProcessSelector `json:"process"`
}

type StreamInputData struct {
	Input *ProcessInput `json:"input"`
}

type StreamInputRequest struct {
	Start     *StreamInputStart `json:"start,omitempty"`
	Data      *StreamInputData  `json:"data,omitempty"`
	KeepAlive *KeepAlive        `json:"keepalive,omitempty"`
}

type StreamInputResponse struct{}

// Signal is the process.Signal enum.
type Signal int32

const (
	SignalUnspecified Signal = 0
	SignalSIGKILL     Signal = 9
	SignalSIGTERM     Signal = 15
)

var signalNames = map[string]int32{"SIGNAL_UNSPECIFIED": 0, "SIGNAL_SIGKILL": 9, "SIGNAL_SIGTERM": 15}

func (s *Signal) UnmarshalJSON(b []byte) error {
	v, err := rpc.EnumValue(b, "process.Signal", signalNames)
	*s = Signal(v)
	return err
}

func (s Signal) MarshalJSON() ([]byte, error) {
	for name, v := range signalNames {
		if Signal(v) == s {
			return json.Marshal(name)
		}
	}
	return json.Marshal(int32(s))
}

type SendSignalRequest struct {
	Process *ProcessSelector `json:"process"`
	Signal  Signal           `json:"signal"`
}

type SendSignalResponse struct{}

type CloseStdinRequest struct {
	Process *ProcessSelector `json:"process"`
}

type CloseStdinResponse struct{}
