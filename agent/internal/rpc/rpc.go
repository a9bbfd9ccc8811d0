// Package rpc serves the Connect protocol's JSON codec over HTTP/1.1 and HTTP/2:
// unary calls (POST, application/json) and server-streaming calls
// (application/connect+json, 5-byte envelopes, an end-of-stream envelope that
// carries the error). It is the subset of https://connectrpc.com/docs/protocol
// that E2B's SDKs use; binary protobuf and compression are refused by name.
package rpc

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Code is a Connect error code, written as its lower_snake name.
type Code string

const (
	Canceled           Code = "canceled"
	Unknown            Code = "unknown"
	InvalidArgument    Code = "invalid_argument"
	DeadlineExceeded   Code = "deadline_exceeded"
	NotFound           Code = "not_found"
	AlreadyExists      Code = "already_exists"
	PermissionDenied   Code = "permission_denied"
	ResourceExhausted  Code = "resource_exhausted"
	FailedPrecondition Code = "failed_precondition"
	Unimplemented      Code = "unimplemented"
	Internal           Code = "internal"
	Unavailable        Code = "unavailable"
	Unauthenticated    Code = "unauthenticated"
)

// httpStatus maps a code to the HTTP status a unary error carries (the protocol's table).
var httpStatus = map[Code]int{
	Canceled: 499, Unknown: 500, InvalidArgument: 400, DeadlineExceeded: 504,
	NotFound: 404, AlreadyExists: 409, PermissionDenied: 403, ResourceExhausted: 429,
	FailedPrecondition: 400, Unimplemented: 501, Internal: 500, Unavailable: 503,
	Unauthenticated: 401,
}

// Error is an error with a Connect code; handlers return it to choose the code.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Errorf makes an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// asError gives any error a code: an *Error keeps its own, anything else is internal.
func asError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &Error{Code: DeadlineExceeded, Message: err.Error()}
	}
	if errors.Is(err, context.Canceled) {
		return &Error{Code: Canceled, Message: err.Error()}
	}
	return &Error{Code: Internal, Message: err.Error()}
}

// WriteError answers a unary call (or any plain request) with a Connect error body.
func WriteError(w http.ResponseWriter, err error) {
	e := asError(err)
	status, ok := httpStatus[e.Code]
	if !ok {
		status = 500
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(e)
}

// maxMessage bounds one request message; the SDK's requests are small JSON.
const maxMessage = 16 << 20

// withTimeout applies the client's Connect-Timeout-Ms to the call's context.
func withTimeout(r *http.Request) (context.Context, context.CancelFunc) {
	ms, err := strconv.ParseInt(r.Header.Get("Connect-Timeout-Ms"), 10, 64)
	if err != nil || ms <= 0 {
		return context.WithCancel(r.Context())
	}
	return context.WithTimeout(r.Context(), time.Duration(ms)*time.Millisecond)
}

func decode(data []byte, into any) error {
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil // an empty body is the empty message
	}
	if err := json.Unmarshal(data, into); err != nil {
		return Errorf(InvalidArgument, "the request is not a valid JSON message: %v", err)
	}
	return nil
}

func mediaType(r *http.Request) string {
	ct := r.Header.Get("Content-Type")
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	return strings.TrimSpace(strings.ToLower(ct))
}

func refuseCompression(r *http.Request, header string) error {
	if enc := r.Header.Get(header); enc != "" && enc != "identity" {
		return Errorf(Unimplemented, "%s %q is not supported: send the request uncompressed", header, enc)
	}
	return nil
}

// Unary serves a unary call: the request message is the JSON body, the answer too.
func Unary[Req, Res any](h func(ctx context.Context, r *http.Request, req *Req) (*Res, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			WriteError(w, Errorf(Unimplemented, "method %s: Connect calls are POST", r.Method))
			return
		}
		if mt := mediaType(r); mt != "application/json" {
			WriteError(w, Errorf(Unimplemented, "content type %q: this agent speaks the JSON codec only (application/json)", mt))
			return
		}
		if err := refuseCompression(r, "Content-Encoding"); err != nil {
			WriteError(w, err)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxMessage+1))
		if err != nil {
			WriteError(w, Errorf(InvalidArgument, "reading the request: %v", err))
			return
		}
		if len(body) > maxMessage {
			WriteError(w, Errorf(ResourceExhausted, "the request is over %d bytes", maxMessage))
			return
		}
		req := new(Req)
		if err := decode(body, req); err != nil {
			WriteError(w, err)
			return
		}
		ctx, cancel := withTimeout(r)
		defer cancel()
		res, err := h(ctx, r, req)
		if err != nil {
			WriteError(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(res)
	})
}

// Stream is the sending half of a server-streaming call. Send is safe to call
// from several goroutines.
type Stream[Res any] struct {
	mu sync.Mutex
	w  http.ResponseWriter
	rc *http.ResponseController
}

const (
	flagEndStream = 0x02
	flagCompress  = 0x01
)

func writeEnvelope(w io.Writer, flags byte, payload []byte) error {
	var head [5]byte
	head[0] = flags
	binary.BigEndian.PutUint32(head[1:], uint32(len(payload)))
	if _, err := w.Write(head[:]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

// Send writes one message and flushes it to the client.
func (s *Stream[Res]) Send(msg *Res) error {
	payload, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := writeEnvelope(s.w, 0, payload); err != nil {
		return err
	}
	return s.rc.Flush()
}

type endStream struct {
	Error    *Error              `json:"error,omitempty"`
	Metadata map[string][]string `json:"metadata,omitempty"`
}

func (s *Stream[Res]) end(err error) {
	msg := endStream{}
	if err != nil {
		msg.Error = asError(err)
	}
	payload, _ := json.Marshal(msg)
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = writeEnvelope(s.w, flagEndStream, payload)
	_ = s.rc.Flush()
}

// readEnvelope reads one enveloped request message.
func readEnvelope(r io.Reader) (flags byte, payload []byte, err error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, nil, Errorf(InvalidArgument, "the request envelope is truncated: send 5 header bytes then the message")
		}
		return 0, nil, err // io.EOF: no more messages
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n > maxMessage {
		return 0, nil, Errorf(ResourceExhausted, "a request message of %d bytes is over %d", n, maxMessage)
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, Errorf(InvalidArgument, "the request envelope is truncated: %v", err)
	}
	return head[0], payload, nil
}

// ServerStream serves a server-streaming call: one enveloped request message,
// any number of enveloped answers, then the end-of-stream envelope. Errors the
// handler returns travel in that last envelope, as the protocol requires.
func ServerStream[Req, Res any](h func(ctx context.Context, r *http.Request, req *Req, s *Stream[Res]) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			WriteError(w, Errorf(Unimplemented, "method %s: Connect calls are POST", r.Method))
			return
		}
		if mt := mediaType(r); mt != "application/connect+json" {
			WriteError(w, Errorf(Unimplemented, "content type %q: this agent speaks the JSON codec only (application/connect+json)", mt))
			return
		}
		if err := refuseCompression(r, "Connect-Content-Encoding"); err != nil {
			WriteError(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/connect+json")
		s := &Stream[Res]{w: w, rc: http.NewResponseController(w)}
		flags, payload, err := readEnvelope(r.Body)
		if errors.Is(err, io.EOF) {
			err = Errorf(InvalidArgument, "the request has no message: send one enveloped request")
		}
		if err == nil && flags&flagCompress != 0 {
			err = Errorf(Unimplemented, "a compressed request message: send it uncompressed")
		}
		req := new(Req)
		if err == nil {
			err = decode(payload, req)
		}
		if err != nil {
			w.WriteHeader(http.StatusOK)
			s.end(err)
			return
		}
		ctx, cancel := withTimeout(r)
		defer cancel()
		w.WriteHeader(http.StatusOK)
		_ = s.rc.Flush()
		s.end(h(ctx, r, req, s))
	})
}

// ClientStream serves a client-streaming call: enveloped request messages until
// the client's end of stream, then one answer and the end-of-stream envelope.
func ClientStream[Req, Res any](h func(ctx context.Context, r *http.Request, next func() (*Req, error)) (*Res, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if mt := mediaType(r); r.Method != http.MethodPost || mt != "application/connect+json" {
			WriteError(w, Errorf(Unimplemented, "%s %q: streaming Connect calls are POST application/connect+json", r.Method, mt))
			return
		}
		w.Header().Set("Content-Type", "application/connect+json")
		s := &Stream[Res]{w: w, rc: http.NewResponseController(w)}
		next := func() (*Req, error) {
			flags, payload, err := readEnvelope(r.Body)
			if err != nil {
				return nil, err // io.EOF: the client is done
			}
			if flags&flagEndStream != 0 {
				return nil, io.EOF
			}
			req := new(Req)
			return req, decode(payload, req)
		}
		ctx, cancel := withTimeout(r)
		defer cancel()
		res, err := h(ctx, r, next)
		w.WriteHeader(http.StatusOK)
		if err == nil {
			err = s.Send(res)
		}
		s.end(err)
	})
}
