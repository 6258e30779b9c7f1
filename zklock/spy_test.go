package zklock

import (
	"encoding/binary"
	"net"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
)

// spy learns a session's id and password from the connect response, the
// first packet on each connection the zk client dials through it, so that
// a test can connect with them and end the session (expireSession). Test
// scaffolding only: the driver reads no frames.
type spy struct {
	mu        sync.Mutex
	sessionID int64
	passwd    []byte
}

func (s *spy) dialer(dial zk.Dialer) zk.Dialer {
	return func(network, addr string, timeout time.Duration) (net.Conn, error) {
		c, err := dial(network, addr, timeout)
		if err != nil {
			return nil, err
		}
		return &spyConn{Conn: c, s: s}, nil
	}
}

// credentials returns the session's id and password, as the server last
// granted them.
func (s *spy) credentials() (int64, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessionID, append([]byte(nil), s.passwd...)
}

// spyConn is read by one goroutine at a time (the zk client's handshake,
// then its receive loop), so head and parsed need no lock.
type spyConn struct {
	net.Conn
	s      *spy
	head   []byte
	parsed bool
}

func (c *spyConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.parsed {
		c.head = append(c.head, p[:n]...)
		c.parse()
	}
	return n, err
}

// parse decodes the connect response: length, protocol version, timeout
// (ms), session id, password.
func (c *spyConn) parse() {
	if len(c.head) < 4 {
		return
	}
	blen := int(binary.BigEndian.Uint32(c.head))
	if blen < 20 || blen > 1024 {
		c.parsed, c.head = true, nil
		return
	}
	if len(c.head) < 4+blen {
		return
	}
	b := c.head[4 : 4+blen]
	c.parsed, c.head = true, nil
	sid := int64(binary.BigEndian.Uint64(b[8:16]))
	plen := int(int32(binary.BigEndian.Uint32(b[16:20])))
	if sid == 0 || plen < 0 || 20+plen > len(b) {
		return // the session expired: the zk client starts a new one
	}
	c.s.mu.Lock()
	c.s.sessionID = sid
	c.s.passwd = append([]byte(nil), b[20:20+plen]...)
	c.s.mu.Unlock()
}
