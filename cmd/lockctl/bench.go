//go:build unix

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"html"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/bench"
	"github.com/lockerhq/locker/internal/servers"
)

// benchTarget is one backend to benchmark.
type benchTarget struct {
	label string
	url   string
	probe []string // host:port that must answer, for the default set
}

// defaultTargets are the backends on their local default addresses (the
// LOCKER_*_ADDR variables of scripts/services.sh change them), plus mem and
// a file directory made for the run.
func defaultTargets(fileDir string) []benchTarget {
	return []benchTarget{
		{label: "mem", url: "mem://bench-" + randSuffix()},
		{label: "file", url: (&url.URL{Scheme: "file", Path: fileDir}).String()},
		{label: "redis", url: "redis://" + servers.RedisAddr() + "/0", probe: []string{servers.RedisAddr()}},
		{label: "redis-fair", url: "redis://" + servers.RedisAddr() + "/0?fair=true", probe: []string{servers.RedisAddr()}},
		{label: "etcd", url: "etcd://" + strings.Join(servers.EtcdEndpoints(), ","), probe: servers.EtcdEndpoints()},
		{label: "zk", url: "zk://" + strings.Join(servers.ZKAddrs(), ","), probe: servers.ZKAddrs()},
		{label: "postgres", url: servers.PostgresURL(), probe: []string{servers.PostgresAddr()}},
		{label: "memcache", url: "memcache://" + servers.MemcacheAddr(), probe: []string{servers.MemcacheAddr()}},
	}
}

func randSuffix() string { return fmt.Sprintf("%x", time.Now().UnixNano()&0xffffff) }

func reachable(addrs []string) error {
	for _, a := range addrs {
		c, err := net.DialTimeout("tcp", a, 500*time.Millisecond)
		if err != nil {
			return err
		}
		c.Close()
	}
	return nil
}

// benchReport is what --json writes.
type benchReport struct {
	Date    time.Time      `json:"date"`
	Machine benchMachine   `json:"machine"`
	Config  benchConfig    `json:"config"`
	Results []bench.Result `json:"results"`
	Took    time.Duration  `json:"took_ns"`
}

type benchMachine struct {
	OS   string `json:"os"`
	Arch string `json:"arch"`
	CPUs int    `json:"cpus"`
	Go   string `json:"go"`
}

type benchConfig struct {
	Duration time.Duration `json:"duration_ns"`
	Parallel int           `json:"parallel"`
	Workers  int           `json:"workers"`
	Clients  int           `json:"clients"`
	Held     int           `json:"held"`
	HeldFor  time.Duration `json:"held_for_ns"`
	TTL      time.Duration `json:"ttl_ns"`
}

func benchCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("lockctl bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	d := bench.Defaults
	backends := fs.String("backends", "", "comma-separated backend `URLs` (default: mem, a file directory, and every server reachable on its local default port)")
	jsonFile := fs.String("json", "", "write the results as JSON to `FILE`")
	svgFile := fs.String("svg", "", "write a bar chart as SVG to `FILE`")
	fs.DurationVar(&d.Duration, "duration", d.Duration, "how long each timed workload runs")
	fs.IntVar(&d.Parallel, "parallel", d.Parallel, "goroutines of the parallel workload, each on its own name")
	fs.IntVar(&d.Workers, "workers", d.Workers, "N: workers contending for one name")
	fs.IntVar(&d.Clients, "clients", d.Clients, "M: clients the contending workers are spread over")
	fs.IntVar(&d.Held, "held", d.Held, "K: locks held at once by one client")
	fs.DurationVar(&d.HeldFor, "held-for", d.HeldFor, "how long the K locks are held while refreshes are counted")
	fs.DurationVar(&d.TTL, "ttl", d.TTL, "lock TTL of every workload")
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			fmt.Fprintf(stderr, "usage: lockctl bench [flags]\n\nRuns the same workloads against each backend and prints one table.\n\nFlags:\n")
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintf(stderr, "lockctl bench: %v (see lockctl bench -h)\n", err)
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "lockctl bench: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	if d.Duration <= 0 || d.Parallel <= 0 || d.Workers <= 0 || d.Clients <= 0 || d.Held <= 0 || d.HeldFor <= 0 || d.TTL <= 0 {
		fmt.Fprintf(stderr, "lockctl bench: every size and duration must be positive\n")
		return exitUsage
	}

	var targets []benchTarget
	if *backends == "" {
		dir, err := os.MkdirTemp("", "lockctl-bench-")
		if err != nil {
			fmt.Fprintf(stderr, "lockctl bench: %v\n", err)
			return exitUsage
		}
		defer os.RemoveAll(dir)
		for _, t := range defaultTargets(dir) {
			if err := reachable(t.probe); err != nil {
				fmt.Fprintf(stderr, "lockctl bench: skipping %s: %v\n", t.label, err)
				continue
			}
			targets = append(targets, t)
		}
	} else {
		seen := map[string]int{}
		for _, raw := range strings.Split(*backends, ",") {
			raw = strings.TrimSpace(raw)
			if raw == "" {
				continue
			}
			raw, _, err := expandURL(raw)
			if err != nil {
				fmt.Fprintf(stderr, "lockctl bench: %v\n", err)
				return exitUsage
			}
			u, err := url.Parse(raw)
			if err != nil || u.Scheme == "" {
				fmt.Fprintf(stderr, "lockctl bench: %q is not a backend URL\n", backend.RedactedString(raw))
				return exitUsage
			}
			label := u.Scheme
			if seen[label]++; seen[label] > 1 {
				label = fmt.Sprintf("%s#%d", label, seen[label])
			}
			targets = append(targets, benchTarget{label: label, url: raw})
		}
	}
	if len(targets) == 0 {
		fmt.Fprintf(stderr, "lockctl bench: no backend to benchmark\n")
		return exitUsage
	}
	// Commas separate URLs in --backends, but some URLs list hosts with
	// commas: etcd://a:2379,b:2379. Rejoin what does not start a URL.
	targets = rejoinTargets(targets)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	prog := newProgress(stderr, len(targets)*len(bench.Workloads))
	report := benchReport{
		Date:    time.Now().UTC(),
		Machine: benchMachine{runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version()},
		Config:  benchConfig{d.Duration, d.Parallel, d.Workers, d.Clients, d.Held, d.HeldFor, d.TTL},
	}
	start := time.Now()
	status := 0
	for _, t := range targets {
		// Fail fast on a backend that cannot be opened.
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		open, opts, err := bench.URLOpener(octx, t.url)
		cancel()
		if err != nil {
			prog.clear()
			fmt.Fprintf(stderr, "lockctl bench: %s: %v\n", t.label, err)
			status = 1
			prog.skip(len(bench.Workloads))
			continue
		}
		cfg := d
		cfg.Progress = func(w string) { prog.step(t.label + ": " + w) }
		r := bench.Run(ctx, t.label, open, opts, cfg)
		r.URL = backend.RedactedString(t.url)
		report.Results = append(report.Results, r)
		for _, e := range r.Errors {
			prog.clear()
			fmt.Fprintf(stderr, "lockctl bench: %s: %s\n", t.label, e)
			status = 1
		}
		if ctx.Err() != nil {
			break
		}
	}
	report.Took = time.Since(start)
	prog.done()

	writeTable(stdout, report)
	if *jsonFile != "" {
		b, err := json.MarshalIndent(report, "", "  ")
		if err == nil {
			err = os.WriteFile(*jsonFile, append(b, '\n'), 0o644)
		}
		if err != nil {
			fmt.Fprintf(stderr, "lockctl bench: %v\n", err)
			status = 1
		}
	}
	if *svgFile != "" {
		if err := os.WriteFile(*svgFile, []byte(chart(report)), 0o644); err != nil {
			fmt.Fprintf(stderr, "lockctl bench: %v\n", err)
			status = 1
		}
	}
	if ctx.Err() != nil {
		return 128 + int(syscall.SIGINT)
	}
	return status
}

// rejoinTargets merges a piece without "://" into the URL before it: the
// comma was part of that URL's host list.
func rejoinTargets(ts []benchTarget) []benchTarget {
	var out []benchTarget
	for _, t := range ts {
		if !strings.Contains(t.url, ":/") && !strings.HasPrefix(t.url, "file:") && !strings.HasPrefix(t.url, "mem:") && len(out) > 0 {
			out[len(out)-1].url += "," + t.url
			continue
		}
		out = append(out, t)
	}
	return out
}

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

// dur formats a latency with three significant digits.
func dur(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.3gms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.3gs", d.Seconds())
	}
}

func rate(r float64) string {
	switch {
	case r >= 1e5:
		return fmt.Sprintf("%.0fk", r/1e3)
	case r >= 1e4:
		return fmt.Sprintf("%.1fk", r/1e3)
	default:
		return fmt.Sprintf("%.0f", r)
	}
}

// writeTable prints the results as one Markdown table.
func writeTable(w io.Writer, rep benchReport) {
	c := rep.Config
	fmt.Fprintf(w, "lockctl bench, %s, %s/%s, %d CPUs, %s, %v per timed workload, TTL %v; took %v\n\n",
		rep.Date.Format("2006-01-02 15:04 MST"), rep.Machine.OS, rep.Machine.Arch, rep.Machine.CPUs, rep.Machine.Go,
		c.Duration, c.TTL, rep.Took.Round(time.Second))
	fmt.Fprintf(w, "| backend | acquire+release p50 | p99 | ops/s | %d parallel: ops/s | p50 | p99 | %d workers on %d clients: acq/s | handoff p50 | p99 | fairness max/min | %d held: heap/lock | refreshes/s | refresh calls/s | goroutines |\n",
		c.Parallel, c.Workers, c.Clients, c.Held)
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, r := range rep.Results {
		cells := []string{r.Backend}
		if l := r.Uncontended; l != nil {
			cells = append(cells, dur(l.P50), dur(l.P99), rate(l.OpsPerSec))
		} else {
			cells = append(cells, "error", "", "")
		}
		if l := r.Parallel; l != nil {
			cells = append(cells, rate(l.OpsPerSec), dur(l.P50), dur(l.P99))
		} else {
			cells = append(cells, "error", "", "")
		}
		if k := r.Contended; k != nil {
			fair := "∞"
			if k.MinPer > 0 {
				fair = fmt.Sprintf("%.2f", k.Fairness)
			}
			cells = append(cells, rate(k.AcquisitionsSec), dur(k.HandoffP50), dur(k.HandoffP99), fair)
		} else {
			cells = append(cells, "error", "", "", "")
		}
		if h := r.Held; h != nil {
			held := fmt.Sprintf("%.0f B", h.BytesPerLock)
			if h.Errors > 0 || h.Lost > 0 {
				held += fmt.Sprintf(" (%d not acquired, %d lost)", h.Errors, h.Lost)
			}
			refreshes, calls := rate(h.RefreshesSec), rate(h.CallsSec)
			if h.Session {
				refreshes, calls = "session", "session"
			} else if h.Batch {
				calls += " (batched)"
			}
			cells = append(cells, held, refreshes, calls, fmt.Sprintf("%+d", h.Goroutines))
		} else {
			cells = append(cells, "error", "", "", "")
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
}

// chart draws four panels of horizontal bars, one bar per backend. Rates
// are on logarithmic axes: the backends differ by orders of magnitude.
func chart(rep benchReport) string {
	type metric struct {
		title string
		unit  string
		value func(bench.Result) (float64, bool)
		log   bool
	}
	c := rep.Config
	metrics := []metric{
		{"Uncontended acquire+release", "ops/s", func(r bench.Result) (float64, bool) {
			if r.Uncontended == nil {
				return 0, false
			}
			return r.Uncontended.OpsPerSec, true
		}, true},
		{fmt.Sprintf("%d goroutines, distinct names", c.Parallel), "ops/s", func(r bench.Result) (float64, bool) {
			if r.Parallel == nil {
				return 0, false
			}
			return r.Parallel.OpsPerSec, true
		}, true},
		{fmt.Sprintf("%d workers on one name, %d clients", c.Workers, c.Clients), "acquisitions/s", func(r bench.Result) (float64, bool) {
			if r.Contended == nil {
				return 0, false
			}
			return r.Contended.AcquisitionsSec, true
		}, true},
		{fmt.Sprintf("Heap per held lock (%d held)", c.Held), "bytes", func(r bench.Result) (float64, bool) {
			if r.Held == nil {
				return 0, false
			}
			return r.Held.BytesPerLock, true
		}, false},
	}
	colors := []string{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"}
	const (
		panelW, barH, gap, labelW, margin = 460, 20, 6, 80, 20
	)
	n := len(rep.Results)
	panelH := 50 + n*(barH+gap) + 20
	width := 2*panelW + 3*margin
	height := 60 + 2*panelH + 2*margin
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
				fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#c00">error</text>`+"\n", labelW+4, y+barH-6)
				continue
			}
			w := scale(v)
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", labelW, y, w, barH, colors[j%len(colors)])
			fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s</text>`+"\n", float64(labelW)+w+4, y+barH-6, html.EscapeString(rate(v)))
		}
		b.WriteString("</g>\n")
	}
	b.WriteString("</svg>\n")
	return b.String()
}
