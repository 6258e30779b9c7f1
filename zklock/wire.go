package zklock

import (
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
)

// wire watches the bytes of a connection the driver opened: the connect
// response (the negotiated timeout, the session's id and password), which
// the zk package keeps to itself, and the requests written. It does not
// time the session: bytes read include watch events, which the server
// sends unasked and which prove nothing about when it last heard from the
// driver (see contact).
type wire struct {
	timeoutMs atomic.Int32

	mu        sync.Mutex
	sessionID int64
	passwd    []byte
	expect    map[string]chan struct{} // container creates someone waits to see sent
}

// opCreateContainer is the opcode of a container create request.
const opCreateContainer = 19

// sent returns a channel closed once a container create of path has been
// written to the connection, and a func to stop waiting. Requests on a
// connection are written in order and the server runs a session's
// requests in order, so a request sent after that runs after the create.
func (w *wire) sent(path string) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	w.mu.Lock()
	if w.expect == nil {
		w.expect = map[string]chan struct{}{}
	}
	w.expect[path] = ch
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		if w.expect[path] == ch {
			delete(w.expect, path)
		}
		w.mu.Unlock()
	}
}

// wrote notes a request written to the connection: header (xid, opcode),
// then, for a create, the path.
func (w *wire) wrote(p []byte) {
	if len(p) < 16 || int32(binary.BigEndian.Uint32(p[8:12])) != opCreateContainer {
		return
	}
	n := int(int32(binary.BigEndian.Uint32(p[12:16])))
	if n < 0 || 16+n > len(p) {
		return
	}
	path := string(p[16 : 16+n])
	w.mu.Lock()
	ch := w.expect[path]
	delete(w.expect, path)
	w.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}

func (w *wire) dialer(dial zk.Dialer) zk.Dialer {
	return func(network, addr string, timeout time.Duration) (net.Conn, error) {
		c, err := dial(network, addr, timeout)
		if err != nil {
			return nil, err
		}
		return &wireConn{Conn: c, w: w}, nil
	}
}

// credentials returns the session's id and password, as the server last
// granted them.
func (w *wire) credentials() (int64, []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sessionID, append([]byte(nil), w.passwd...)
}

// wireConn is read by one goroutine at a time (the zk client's handshake,
// then its receive loop), so head and parsed need no lock.
type wireConn struct {
	net.Conn
	w      *wire
	head   []byte
	parsed bool
}

func (c *wireConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err == nil {
		c.w.wrote(p) // the zk client writes each request whole
	}
	return n, err
}

func (c *wireConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		if !c.parsed {
			c.head = append(c.head, p[:n]...)
			c.parse()
		}
	}
	return n, err
}

// parse decodes the connect response, the first packet on a connection:
// length, protocol version, timeout (ms), session id, password.
func (c *wireConn) parse() {
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
	timeout := int32(binary.BigEndian.Uint32(b[4:8]))
	sid := int64(binary.BigEndian.Uint64(b[8:16]))
	plen := int(int32(binary.BigEndian.Uint32(b[16:20])))
	if sid == 0 || plen < 0 || 20+plen > len(b) {
		return // the session expired: the zk client starts a new one
	}
	c.w.timeoutMs.Store(timeout)
	c.w.mu.Lock()
	c.w.sessionID = sid
	c.w.passwd = append([]byte(nil), b[20:20+plen]...)
	c.w.mu.Unlock()
}
