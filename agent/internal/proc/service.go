package proc

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"time"

	"warren.dev/agent/internal/identity"
	"warren.dev/agent/internal/rpc"
)

// Service is process.Process over Connect.
type Service struct {
	Procs *Manager
	Self  *identity.User
}

// Register mounts the service's methods on a mux.
func (s *Service) Register(mux *http.ServeMux) {
	mux.Handle("/process.Process/Start", rpc.ServerStream(s.start))
	mux.Handle("/process.Process/Connect", rpc.ServerStream(s.connect))
	mux.Handle("/process.Process/List", rpc.Unary(s.list))
	mux.Handle("/process.Process/SendInput", rpc.Unary(s.sendInput))
	mux.Handle("/process.Process/StreamInput", rpc.ClientStream(s.streamInput))
	mux.Handle("/process.Process/CloseStdin", rpc.Unary(s.closeStdin))
	mux.Handle("/process.Process/SendSignal", rpc.Unary(s.sendSignal))
	mux.Handle("/process.Process/Update", rpc.Unary(s.update))
}

// keepAliveEvery reads the interval (seconds) the SDK asks keepalive events at.
func keepAliveEvery(r *http.Request) time.Duration {
	secs, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval"))
	if err != nil || secs <= 0 {
		return 0
	}
	return time.Duration(secs) * time.Second
}

// follow sends a start event, then the process's events until it ends or the client leaves.
func follow[Res any](ctx context.Context, r *http.Request, p *Process, sub *subscriber, wrap func(*ProcessEvent) *Res, st *rpc.Stream[Res]) error {
	defer p.leave(sub)
	if err := st.Send(wrap(&ProcessEvent{Start: &StartEvent{Pid: p.Pid}})); err != nil {
		return err
	}
	var tick <-chan time.Time
	if every := keepAliveEvery(r); every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case ev, ok := <-sub.events:
			if !ok {
				return nil
			}
			if err := st.Send(wrap(ev)); err != nil {
				return err
			}
		case <-tick:
			if err := st.Send(wrap(&ProcessEvent{KeepAlive: &KeepAlive{}})); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (s *Service) start(ctx context.Context, r *http.Request, req *StartRequest, st *rpc.Stream[StartResponse]) error {
	user, err := identity.FromRequest(r, s.Self)
	if err != nil {
		return err
	}
	p, sub, err := s.Procs.Start(req, user)
	if err != nil {
		return err
	}
	return follow(ctx, r, p, sub, func(ev *ProcessEvent) *StartResponse { return &StartResponse{Event: ev} }, st)
}

func (s *Service) connect(ctx context.Context, r *http.Request, req *ConnectRequest, st *rpc.Stream[StartResponse]) error {
	p, sub, err := s.Procs.Attach(req.Process)
	if err != nil {
		return err
	}
	return follow(ctx, r, p, sub, func(ev *ProcessEvent) *StartResponse { return &StartResponse{Event: ev} }, st)
}

func (s *Service) list(_ context.Context, _ *http.Request, _ *ListRequest) (*ListResponse, error) {
	return &ListResponse{Processes: s.Procs.List()}, nil
}

func stdinOf(in *ProcessInput) ([]byte, error) {
	if in == nil {
		return nil, rpc.Errorf(rpc.InvalidArgument, "input is empty: send stdin bytes")
	}
	if in.PTY != nil {
		return in.PTY, nil
	}
	return in.Stdin, nil
}

func (s *Service) sendInput(_ context.Context, _ *http.Request, req *SendInputRequest) (*SendInputResponse, error) {
	data, err := stdinOf(req.Input)
	if err != nil {
		return nil, err
	}
	return &SendInputResponse{}, s.Procs.WriteStdin(req.Process, data)
}

func (s *Service) streamInput(_ context.Context, _ *http.Request, next func() (*StreamInputRequest, error)) (*StreamInputResponse, error) {
	var sel *ProcessSelector
	for {
		msg, err := next()
		if err == io.EOF {
			return &StreamInputResponse{}, nil
		}
		if err != nil {
			return nil, err
		}
		switch {
		case msg.Start != nil:
			sel = msg.Start.Process
		case msg.Data != nil:
			if sel == nil {
				return nil, rpc.Errorf(rpc.InvalidArgument, "input before the start event: send start with the process first")
			}
			data, err := stdinOf(msg.Data.Input)
			if err != nil {
				return nil, err
			}
			if err := s.Procs.WriteStdin(sel, data); err != nil {
				return nil, err
			}
		}
	}
}

func (s *Service) closeStdin(_ context.Context, _ *http.Request, req *CloseStdinRequest) (*CloseStdinResponse, error) {
	return &CloseStdinResponse{}, s.Procs.CloseStdin(req.Process)
}

func (s *Service) sendSignal(_ context.Context, _ *http.Request, req *SendSignalRequest) (*SendSignalResponse, error) {
	return &SendSignalResponse{}, s.Procs.Signal(req.Process, req.Signal)
}

func (s *Service) update(_ context.Context, _ *http.Request, req *UpdateRequest) (*UpdateResponse, error) {
	return &UpdateResponse{}, s.Procs.Resize(req.Process, req.PTY)
}
