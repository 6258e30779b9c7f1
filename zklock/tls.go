package zklock

import (
	"crypto/tls"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
)

// WithTLS makes the driver's own connection speak TLS with c (URL: tls=,
// ca=, cert=, key=, server_name=, skip_verify=, read by
// backend.Params.TLS): ZooKeeper's secureClientPort. The server's
// certificate is checked against the host dialled unless c names another.
func WithTLS(c *tls.Config) Option { return func(cfg *config) { cfg.tls = c } }

// secure wraps dial with a TLS handshake, bounded by the dial timeout. The
// zk client retries a failed dial for ever and logs only that it failed, so
// the last handshake error is kept for Dial's error (a wrong CA or a refused
// client certificate must not read as a bare timeout).
type secure struct {
	cfg  *tls.Config
	dial zk.Dialer
	last atomic.Pointer[error]
}

func (s *secure) dialer(network, addr string, timeout time.Duration) (net.Conn, error) {
	raw, err := s.dial(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	cfg := s.cfg.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
	}
	c := tls.Client(raw, cfg)
	_ = raw.SetDeadline(time.Now().Add(timeout))
	if err := c.Handshake(); err != nil {
		raw.Close()
		err = fmt.Errorf("TLS handshake with %s: %w", addr, err)
		s.last.Store(&err)
		return nil, err
	}
	_ = raw.SetDeadline(time.Time{})
	return &firstRead{Conn: c, s: s}, nil
}

// firstRead keeps the error of a connection's first read: with TLS 1.3 the
// client's handshake ends before the server has checked the client's
// certificate, and a refusal ("certificate required") comes as that error.
type firstRead struct {
	net.Conn
	s    *secure
	read atomic.Bool
}

func (c *firstRead) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.read.Store(true)
	} else if err != nil && !c.read.Load() {
		err := fmt.Errorf("TLS connection to %s: %w", c.RemoteAddr(), err)
		c.s.last.Store(&err)
	}
	return n, err
}

// lastErr is the last handshake error, or nil.
func (s *secure) lastErr() error {
	if s == nil {
		return nil
	}
	if p := s.last.Load(); p != nil {
		return *p
	}
	return nil
}
