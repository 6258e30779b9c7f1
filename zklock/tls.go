package zklock

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/conntrack"
)

// trace keeps what became of the latest connection to each server, so that
// Dial's error says more than a timeout: a wrong CA, a refused client
// certificate, plaintext against a TLS port.
type trace struct {
	tls  *tls.Config // nil: plaintext
	dial zk.Dialer

	mu     sync.Mutex
	last   map[string]error // by address; nil once a connection was answered
	latest error
}

func (t *trace) note(addr string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.last[addr] = err
	if err != nil {
		t.latest = err
	}
}

func (t *trace) dialer(network, addr string, timeout time.Duration) (net.Conn, error) {
	raw, err := t.dial(network, addr, timeout)
	if err != nil {
		if !errors.Is(err, conntrack.ErrCut) {
			t.note(addr, err)
		}
		return nil, err
	}
	if t.tls == nil {
		return &firstRead{Conn: raw, t: t, addr: addr}, nil
	}
	cfg := t.tls.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
	}
	c := tls.Client(raw, cfg)
	_ = raw.SetDeadline(time.Now().Add(timeout))
	if err := c.Handshake(); err != nil {
		raw.Close()
		err = tlsErr(fmt.Errorf("TLS handshake with %s: %w", addr, err))
		t.note(addr, err)
		return nil, err
	}
	_ = raw.SetDeadline(time.Time{})
	return &firstRead{Conn: c, t: t, addr: addr}, nil
}

// tlsErr marks a refusal no retry cures: of our certificate by the server
// (ErrPermission), or of its certificate by us.
func tlsErr(err error) error {
	// A VerifyConnection (server_name=) returns x509's errors unwrapped.
	var (
		verr *tls.CertificateVerificationError
		herr x509.HostnameError
		aerr x509.UnknownAuthorityError
		cerr x509.CertificateInvalidError
	)
	if errors.As(err, &verr) || errors.As(err, &herr) || errors.As(err, &aerr) || errors.As(err, &cerr) {
		return permanentErr{err}
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" {
		// The alert type is unexported: its code is a uint8.
		if v := reflect.ValueOf(op.Err); v.Kind() == reflect.Uint8 {
			switch v.Uint() {
			case 42, 43, 44, 45, 46, 48, 49, 116: // bad, unsupported, revoked, expired, unknown certificate; unknown CA; access denied; certificate required
				return permanentErr{fmt.Errorf("%w: the server refused our client certificate: %w", backend.ErrPermission, err)}
			}
		}
		return permanentErr{err}
	}
	return err
}

// permanentErr is a connection failure that Dial reports at once.
type permanentErr struct{ error }

func (e permanentErr) Unwrap() error { return e.error }

// firstRead keeps the error of a connection's first read: with TLS 1.3 a
// refused client certificate shows there, and a TLS port read in plaintext
// closes the connection without a word.
type firstRead struct {
	net.Conn
	t    *trace
	addr string
	read atomic.Bool
}

func (c *firstRead) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		if !c.read.Swap(true) {
			c.t.note(c.addr, nil)
		}
	} else if err != nil && !c.read.Load() {
		switch {
		case c.t.tls != nil:
			err := tlsErr(fmt.Errorf("TLS connection to %s: %w", c.addr, err))
			c.t.note(c.addr, err)
		case errors.Is(err, net.ErrClosed):
			// We closed it.
		case errors.Is(err, io.EOF):
			c.t.note(c.addr, fmt.Errorf("%s closed the connection before it answered (a TLS port? the URL needs tls=true and ca=, cert=, key=)", c.addr))
		default:
			c.t.note(c.addr, fmt.Errorf("connection to %s: %w", c.addr, err))
		}
	}
	return n, err
}

// cause is the latest connection failure, or nil.
func (t *trace) cause() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.latest
}

// refused is a permanent failure when the latest connection to each of n
// servers failed for good, or nil.
func (t *trace) refused(n int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.last) < n {
		return nil
	}
	for _, err := range t.last {
		if !errors.As(err, new(permanentErr)) {
			return nil
		}
	}
	return t.latest
}
