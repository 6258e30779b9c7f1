//go:build unix

package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// progress draws a bar on stderr when stderr is a terminal, and nothing
// otherwise.
type progress struct {
	w        io.Writer
	tty      bool
	n, total int
	start    time.Time
}

func newProgress(w io.Writer, total int) *progress {
	p := &progress{w: w, total: total, start: time.Now()}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

func (p *progress) draw(what string) {
	if !p.tty {
		return
	}
	const width = 28
	filled := width * p.n / max(p.total, 1)
	fmt.Fprintf(p.w, "\r\033[K[%s%s] %d/%d %s (%s)", strings.Repeat("#", filled), strings.Repeat(".", width-filled),
		p.n, p.total, what, time.Since(p.start).Round(time.Second))
}

func (p *progress) step(what string) {
	p.draw(what)
	p.n++
}

func (p *progress) skip(n int) { p.n += n }

func (p *progress) clear() {
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
}

func (p *progress) done() { p.clear() }
