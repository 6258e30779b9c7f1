package faultproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// link is one proxied connection: a client side and a server side, with a
// reader and a writer goroutine per direction. The reader stamps each chunk
// with its due time; the writer applies the fault in force when the chunk
// falls due, so a blackhole or stall also catches bytes already in flight.
type link struct {
	p              *Proxy
	client, server net.Conn
	done           chan struct{}
	once           sync.Once
	writers        int // guarded by p.mu: writers still running
}

type chunk struct {
	data []byte
	due  time.Time
}

// queueLen bounds the chunks in flight per direction; a full queue stops
// the reader, which pushes back on the sender as a slow network does.
const queueLen = 256

func (l *link) start(dir int, src, dst net.Conn) {
	q := make(chan chunk, queueLen)
	go l.read(dir, src, q)
	go l.write(dir, dst, q)
}

func (l *link) read(dir int, src net.Conn, q chan<- chunk) {
	defer l.p.wg.Done()
	defer close(q)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			st, _ := l.p.snapshot()
			c := chunk{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(st.delay[dir])}
			select {
			case q <- c:
			case <-l.done:
				return
			}
		}
		if err != nil {
			// A reset (not a FIN) from one side resets the other.
			if !errors.Is(err, io.EOF) {
				l.reset()
			}
			return
		}
	}
}

func (l *link) write(dir int, dst net.Conn, q <-chan chunk) {
	defer l.p.wg.Done()
	defer l.writerDone()
	for c := range q {
		if !l.wait(c.due) {
			return
		}
		st, ok := l.unheld(dir)
		if !ok {
			return
		}
		if st.drop[dir] {
			l.count(dir, int64(len(c.data)), true)
			continue
		}
		if _, err := dst.Write(c.data); err != nil {
			l.reset()
			return
		}
		l.count(dir, int64(len(c.data)), false)
	}
	// The source ended. Pass the FIN on, unless the direction is blackholed:
	// a partition hides the close too.
	if st, _ := l.p.snapshot(); !st.drop[dir] {
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}
}

// wait sleeps until due; false if the link ended first.
func (l *link) wait(due time.Time) bool {
	d := time.Until(due)
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.done:
		return false
	}
}

// unheld waits while the direction is stalled and returns the state then in
// force; false if the link ended first.
func (l *link) unheld(dir int) (state, bool) {
	for {
		st, changed := l.p.snapshot()
		if !st.hold[dir] {
			return st, true
		}
		select {
		case <-changed:
		case <-l.done:
			return st, false
		}
	}
}

func (l *link) count(dir int, n int64, dropped bool) {
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	switch {
	case dir == up && dropped:
		l.p.stats.DroppedUp += n
	case dir == up:
		l.p.stats.ForwardedUp += n
	case dropped:
		l.p.stats.DroppedDown += n
	default:
		l.p.stats.ForwardedDown += n
	}
}

// writerDone closes the link once both directions have ended.
func (l *link) writerDone() {
	l.p.mu.Lock()
	l.writers--
	last := l.writers == 0
	l.p.mu.Unlock()
	if last {
		l.close(false)
	}
}

func (l *link) reset() { l.close(true) }

// close ends the link once: both connections closed (reset if rst), every
// goroutine woken, the link forgotten.
func (l *link) close(rst bool) {
	l.once.Do(func() {
		close(l.done)
		if rst {
			resetConn(l.client)
			resetConn(l.server)
		} else {
			_ = l.client.Close()
			_ = l.server.Close()
		}
		l.p.mu.Lock()
		delete(l.p.links, l)
		l.p.mu.Unlock()
	})
}
