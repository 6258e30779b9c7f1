//go:build unix

package main

import (
	"fmt"
	"html"
	"math"
	"strings"

	"github.com/lockerhq/locker/internal/bench"
)

// chart draws seven panels of horizontal bars, one bar per backend. Rates
// are on logarithmic axes: the backends differ by orders of magnitude.
func chart(rep benchReport) string {
	type metric struct {
		title string
		unit  string
		value func(bench.Result) (float64, bool)
		log   bool
		note  func(bench.Result) string // after the value, if set
	}
	c := rep.Config
	metrics := []metric{
		{"Uncontended acquire+release", "ops/s", func(r bench.Result) (float64, bool) {
			if r.Uncontended == nil {
				return 0, false
			}
			return r.Uncontended.OpsPerSec, true
		}, true, nil},
		{fmt.Sprintf("%d goroutines, distinct names", c.Parallel), "ops/s", func(r bench.Result) (float64, bool) {
			if r.Parallel == nil {
				return 0, false
			}
			return r.Parallel.Lock.PerSec.Median, true
		}, true, nil},
		{fmt.Sprintf("%d workers on one name, %d clients", c.Workers, c.Clients), "acquisitions/s", func(r bench.Result) (float64, bool) {
			if r.Contended == nil {
				return 0, false
			}
			return r.Contended.AcquisitionsSec, true
		}, true, nil},
		{fmt.Sprintf("Heap per held lock (%d held)", c.Held), "bytes", func(r bench.Result) (float64, bool) {
			if r.Held == nil {
				return 0, false
			}
			return r.Held.BytesPerLock, true
		}, false, nil},

		{"Acquire+release over the raw floor", "median ratio, interleaved", func(r bench.Result) (float64, bool) {
			a := r.Floor.Subject(bench.SubjectAcquire)
			if a == nil || a.VsFloor.Rounds == 0 {
				return 0, false
			}
			return a.VsFloor.Median, true
		}, false, nil},
		{fmt.Sprintf("%d workers on one name, %d clients", c.ScaleWorkers, c.ScaleClients), "acquisitions/s", func(r bench.Result) (float64, bool) {
			if r.Scale == nil {
				return 0, false
			}
			return r.Scale.AcquisitionsSec, true
		}, true, nil},
		{fmt.Sprintf("Tries/acquisition, %d workers, one name", c.ScaleWorkers), "who counts, after each", func(r bench.Result) (float64, bool) {
			if r.Scale == nil || r.Scale.TriesFrom == bench.TriesNone {
				return 0, false
			}
			return r.Scale.Tries, true
		}, false, func(r bench.Result) string { return r.Scale.TriesFrom }},
	}
	colors := []string{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"}
	const (
		panelW, barH, gap, labelW, margin = 460, 20, 6, 80, 20
	)
	n := len(rep.Results)
	panelH := 50 + n*(barH+gap) + 20
	width := 2*panelW + 3*margin
	rows := (len(metrics) + 1) / 2
	height := 60 + rows*panelH + rows*margin
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="28" font-size="16" font-weight="bold">lockctl bench — %s, %d CPUs, %s</text>`+"\n",
		margin, html.EscapeString(rep.Date.Format("2006-01-02")), rep.Machine.CPUs, html.EscapeString(rep.Machine.OS+"/"+rep.Machine.Arch))
	for i, m := range metrics {
		x0 := margin + (i%2)*(panelW+margin)
		y0 := 50 + (i/2)*(panelH+margin)
		fmt.Fprintf(&b, `<g transform="translate(%d,%d)">`+"\n", x0, y0)
		fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="none" stroke="#ccc"/>`+"\n", panelW, panelH)
		fmt.Fprintf(&b, `<text x="10" y="22" font-weight="bold">%s <tspan font-weight="normal" fill="#666">(%s)</tspan></text>`+"\n",
			html.EscapeString(m.title), html.EscapeString(m.unit))
		if m.log {
			fmt.Fprintf(&b, `<text x="%d" y="22" text-anchor="end" font-size="9" fill="#999">log scale</text>`+"\n", panelW-10)
		}
		maxV := 1.0
		for _, r := range rep.Results {
			if v, ok := m.value(r); ok && v > maxV {
				maxV = v
			}
		}
		barW := float64(panelW - labelW - 70)
		var scale func(float64) float64
		if m.log {
			top := max(math.Ceil(math.Log10(maxV)), 1)
			scale = func(v float64) float64 { return barW * math.Log10(max(v, 1)) / top }
			for k := 0; k <= int(top); k++ {
				x := float64(labelW) + barW*float64(k)/top
				fmt.Fprintf(&b, `<line x1="%.1f" y1="34" x2="%.1f" y2="%d" stroke="#eee"/>`+"\n", x, x, panelH-16)
				fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="9" fill="#999" text-anchor="middle">1e%d</text>`+"\n", x, panelH-5, k)
			}
		} else {
			scale = func(v float64) float64 { return barW * max(v, 0) / maxV }
			fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="9" fill="#999">linear scale</text>`+"\n", labelW, panelH-5)
		}
		for j, r := range rep.Results {
			y := 40 + j*(barH+gap)
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", labelW-6, y+barH-6, html.EscapeString(r.Backend))
			v, ok := m.value(r)
			if !ok {
				fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#999">—</text>`+"\n", labelW+4, y+barH-6)
				continue
			}
			w := scale(v)
			label := rate(v)
			if !m.log && v < 100 {
				label = fmt.Sprintf("%.2f", v)
			}
			if m.note != nil {
				label += " (" + m.note(r) + ")"
			}
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", labelW, y, w, barH, colors[j%len(colors)])
			fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s</text>`+"\n", float64(labelW)+w+4, y+barH-6, html.EscapeString(label))
		}
		b.WriteString("</g>\n")
	}
	b.WriteString("</svg>\n")
	return b.String()
}
