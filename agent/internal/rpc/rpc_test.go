package rpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

type echoReq struct {
	Text string `json:"text"`
	N    Uint32 `json:"n"`
}

type echoRes struct {
	Text string `json:"text"`
	Big  Int64  `json:"big"`
}

func envelope(flags byte, payload string) []byte {
	out := make([]byte, 5, 5+len(payload))
	out[0] = flags
	binary.BigEndian.PutUint32(out[1:], uint32(len(payload)))
	return append(out, payload...)
}

// envelopes splits a streamed body into its messages.
func envelopes(t *testing.T, body io.Reader) (flags []byte, payloads []string) {
	t.Helper()
	for {
		f, p, err := readEnvelope(body)
		if errors.Is(err, io.EOF) {
			return flags, payloads
		}
		if err != nil {
			t.Fatalf("reading envelope: %v", err)
		}
		flags = append(flags, f)
		payloads = append(payloads, string(p))
	}
}

func TestUnaryAnswersJSONAndMapsErrors(t *testing.T) {
	h := Unary(func(_ context.Context, _ *http.Request, req *echoReq) (*echoRes, error) {
		if req.Text == "missing" {
			return nil, Errorf(NotFound, "%s is not here", req.Text)
		}
		if req.Text == "boom" {
			return nil, errors.New("plain failure")
		}
		return &echoRes{Text: req.Text, Big: Int64(int64(req.N) << 33)}, nil
	})
	cases := []struct {
		name, contentType, body string
		status                  int
		want                    string
	}{
		{"ok", "application/json", `{"text":"hi","n":"3"}`, 200, `{"text":"hi","big":"25769803776"}`},
		{"empty body is the empty message", "application/json", ``, 200, `{"text":"","big":"0"}`},
		{"handler error keeps its code", "application/json", `{"text":"missing"}`, 404, `{"code":"not_found","message":"missing is not here"}`},
		{"other errors are internal", "application/json", `{"text":"boom"}`, 500, `{"code":"internal","message":"plain failure"}`},
		{"bad JSON", "application/json", `{"text":`, 400, `"invalid_argument"`},
		{"binary codec refused", "application/proto", `x`, 501, `"unimplemented"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "/x.Y/Z", strings.NewReader(c.body))
			req.Header.Set("Content-Type", c.contentType)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != c.status {
				t.Fatalf("status %d, want %d (body %s)", rec.Code, c.status, rec.Body)
			}
			if got := strings.TrimSpace(rec.Body.String()); !strings.Contains(got, c.want) {
				t.Fatalf("body %s, want it to contain %s", got, c.want)
			}
		})
	}
}

func TestServerStreamEnvelopesAndEndsWithTheError(t *testing.T) {
	h := ServerStream(func(_ context.Context, _ *http.Request, req *echoReq, s *Stream[echoRes]) error {
		for i := 0; i < int(req.N); i++ {
			if err := s.Send(&echoRes{Text: req.Text}); err != nil {
				return err
			}
		}
		if req.Text == "fail" {
			return Errorf(FailedPrecondition, "stopped")
		}
		return nil
	})
	run := func(body []byte) (*httptest.ResponseRecorder, []byte, []string) {
		req := httptest.NewRequest(http.MethodPost, "/x.Y/Z", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/connect+json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		flags, payloads := envelopes(t, rec.Body)
		return rec, flags, payloads
	}

	rec, flags, payloads := run(envelope(0, `{"text":"a","n":2}`))
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "application/connect+json" {
		t.Fatalf("status %d, content type %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	if want := []byte{0, 0, flagEndStream}; !bytes.Equal(flags, want) {
		t.Fatalf("flags %v, want %v", flags, want)
	}
	if payloads[0] != `{"text":"a","big":"0"}` || payloads[2] != `{}` {
		t.Fatalf("payloads %q", payloads)
	}

	_, flags, payloads = run(envelope(0, `{"text":"fail","n":1}`))
	var end endStream
	if err := json.Unmarshal([]byte(payloads[len(payloads)-1]), &end); err != nil || flags[len(flags)-1] != flagEndStream {
		t.Fatalf("last envelope %q (flags %v): %v", payloads, flags, err)
	}
	if end.Error == nil || end.Error.Code != FailedPrecondition || end.Error.Message != "stopped" {
		t.Fatalf("end-of-stream error %+v, want failed_precondition: stopped", end.Error)
	}

	_, _, payloads = run([]byte{0, 0, 0})
	if len(payloads) != 1 || !strings.Contains(payloads[0], `"invalid_argument"`) {
		t.Fatalf("a truncated envelope should end the stream with an error, got %q", payloads)
	}
}

func TestClientStreamReadsUntilTheClientEnds(t *testing.T) {
	h := ClientStream(func(_ context.Context, _ *http.Request, next func() (*echoReq, error)) (*echoRes, error) {
		var all []string
		for {
			msg, err := next()
			if errors.Is(err, io.EOF) {
				return &echoRes{Text: strings.Join(all, "+")}, nil
			}
			if err != nil {
				return nil, err
			}
			all = append(all, msg.Text)
		}
	})
	body := append(append(envelope(0, `{"text":"a"}`), envelope(0, `{"text":"b"}`)...), envelope(flagEndStream, `{}`)...)
	req := httptest.NewRequest(http.MethodPost, "/x.Y/Z", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/connect+json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	_, payloads := envelopes(t, rec.Body)
	if len(payloads) != 2 || payloads[0] != `{"text":"a+b","big":"0"}` || payloads[1] != `{}` {
		t.Fatalf("payloads %q", payloads)
	}
}

func TestEnumValueByNameOrNumber(t *testing.T) {
	names := map[string]int32{"A": 1, "B": 2}
	for in, want := range map[string]int32{`"B"`: 2, `1`: 1} {
		got, err := EnumValue([]byte(in), "E", names)
		if err != nil || got != want {
			t.Fatalf("EnumValue(%s) = %d, %v; want %d", in, got, err, want)
		}
	}
	if _, err := EnumValue([]byte(`"C"`), "E", names); err == nil {
		t.Fatal("an unknown enum name must be refused")
	}
}
