//go:build unix

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/lockerhq/locker"
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
// LOCKER_*_ADDR variables of scripts/services.sh change them), plus mem, and
// a file directory and an SQLite database in dir, made for the run.
func defaultTargets(dir string) []benchTarget {
	fileDir := filepath.Join(dir, "files")
	return []benchTarget{
		{label: "mem", url: "mem://bench-" + randSuffix()},
		{label: "file", url: (&url.URL{Scheme: "file", Path: fileDir}).String()},
		{label: "redis", url: "redis://" + servers.RedisAddr() + "/0", probe: []string{servers.RedisAddr()}},
		{label: "redis-fair", url: "redis://" + servers.RedisAddr() + "/0?fair=true", probe: []string{servers.RedisAddr()}},
		{label: "etcd", url: "etcd://" + strings.Join(servers.EtcdEndpoints(), ","), probe: servers.EtcdEndpoints()},
		{label: "zk", url: "zk://" + strings.Join(servers.ZKAddrs(), ","), probe: servers.ZKAddrs()},
		{label: "postgres", url: servers.PostgresURL(), probe: []string{servers.PostgresAddr()}},
		{label: "mysql", url: servers.MySQLURL(), probe: []string{servers.MySQLAddr()}},
		{label: "sqlite", url: (&url.URL{Scheme: "sqlite", Path: filepath.Join(dir, "locks.db")}).String()},
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
	Duration   time.Duration `json:"duration_ns"`
	Parallel   int           `json:"parallel"`
	Workers    int           `json:"workers"`
	Clients    int           `json:"clients"`
	Held       int           `json:"held"`
	HeldFor    time.Duration `json:"held_for_ns"`
	TTL        time.Duration `json:"ttl_ns"`
	SemLimit   int           `json:"semaphore_limit"`
	SemWorkers int           `json:"semaphore_workers"`

	ScaleWorkers int      `json:"scale_workers"`
	ScaleClients int      `json:"scale_clients"`
	Names        int      `json:"names"`
	NameWorkers  int      `json:"name_workers"`
	NameClients  int      `json:"name_clients"`
	Workloads    []string `json:"workloads"`
}

func benchCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("lockctl bench")
	d := bench.Defaults
	backends := fs.String("backends", "", "comma-separated backend `URLs` (default: mem, a file directory, and every server reachable on its local default port)")
	jsonFile := fs.String("json", "", "write the results as JSON to `FILE`")
	svgFile := fs.String("svg", "", "write a bar chart as SVG to `FILE`")
	fs.duration(&d.Duration, "duration", d.Duration, "how long each timed workload runs")
	fs.IntVar(&d.Parallel, "parallel", d.Parallel, "goroutines of the parallel workload, each on its own name")
	fs.IntVar(&d.Workers, "workers", d.Workers, "N: workers contending for one name")
	fs.IntVar(&d.Clients, "clients", d.Clients, "M: clients the contending workers are spread over")
	fs.IntVar(&d.SemLimit, "sem-limit", d.SemLimit, "permits of the semaphore workload's semaphore")
	fs.IntVar(&d.SemWorkers, "sem-workers", d.SemWorkers, "workers sharing the semaphore, spread over the clients")
	fs.IntVar(&d.Held, "held", d.Held, "K: locks held at once by one client")
	fs.duration(&d.HeldFor, "held-for", d.HeldFor, "how long the K locks are held while refreshes are counted")
	fs.duration(&d.TTL, "ttl", d.TTL, "lock TTL of every workload")
	fs.IntVar(&d.ScaleWorkers, "scale-workers", d.ScaleWorkers, "workers on one name in the scale workload (after as many as --scale-clients)")
	fs.IntVar(&d.ScaleClients, "scale-clients", d.ScaleClients, "clients the scale workload's workers are spread over")
	fs.IntVar(&d.Names, "names", d.Names, "names of the names workload")
	fs.IntVar(&d.NameWorkers, "name-workers", d.NameWorkers, "workers on each name of the names workload")
	fs.IntVar(&d.NameClients, "name-clients", d.NameClients, "clients the names workload's workers are spread over")
	workloads := fs.String("workloads", "", "comma-separated `WORKLOADS` to run (default all: "+strings.Join(bench.Workloads, ",")+")")
	if code, ok := fs.parse(args, "usage: lockctl bench [flags]\n\nRuns the same workloads against each backend and prints one table.\n\n", stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "lockctl bench: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	if d.Duration <= 0 || d.Parallel <= 0 || d.Workers <= 0 || d.Clients <= 0 || d.Held <= 0 || d.HeldFor <= 0 || d.TTL <= 0 {
		fmt.Fprintf(stderr, "lockctl bench: every size and duration must be positive\n")
		return exitUsage
	}
	if d.SemWorkers <= 0 || locker.CheckLimit(d.SemLimit) != nil {
		fmt.Fprintf(stderr, "lockctl bench: --sem-workers must be positive and --sem-limit 1 to %d\n", locker.MaxLimit)
		return exitUsage
	}
	if d.ScaleWorkers <= 0 || d.ScaleClients <= 0 || d.Names <= 0 || d.NameWorkers <= 0 || d.NameClients <= 0 {
		fmt.Fprintf(stderr, "lockctl bench: every size and duration must be positive\n")
		return exitUsage
	}
	if *workloads != "" {
		for _, w := range strings.Split(*workloads, ",") {
			if w = strings.TrimSpace(w); !slices.Contains(bench.Workloads, w) {
				fmt.Fprintf(stderr, "lockctl bench: no workload %q (there are %s)\n", w, strings.Join(bench.Workloads, ", "))
				return exitUsage
			}
			if !slices.Contains(d.Only, w) {
				d.Only = append(d.Only, w)
			}
		}
	}
	ran := bench.Workloads
	if len(d.Only) > 0 {
		ran = d.Only
	}
	nWorkloads := len(ran)

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
	prog := newProgress(stderr, len(targets)*nWorkloads)
	report := benchReport{
		Date:    time.Now().UTC(),
		Machine: benchMachine{runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version()},
		Config: benchConfig{d.Duration, d.Parallel, d.Workers, d.Clients, d.Held, d.HeldFor, d.TTL, d.SemLimit, d.SemWorkers,
			d.ScaleWorkers, d.ScaleClients, d.Names, d.NameWorkers, d.NameClients, ran},
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
			prog.skip(nWorkloads)
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
	writeFloorTable(stdout, report)
	writeScaleTable(stdout, report)
	writeSemaphoreTable(stdout, report)
	writeSetTable(stdout, report)
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
