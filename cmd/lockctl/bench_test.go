//go:build unix

package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockerhq/locker/internal/bench"
)

func TestBenchCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fileURL := (&url.URL{Scheme: "file", Path: filepath.Join(dir, "locks"), RawQuery: "sync=false"}).String()
	jsonFile, svgFile := filepath.Join(dir, "b.json"), filepath.Join(dir, "b.svg")
	var out, errb bytes.Buffer
	code := lockctl([]string{"bench", "--backends", "mem://b1," + fileURL + ",mem://b2",
		"--duration", "100ms", "--held", "200", "--held-for", "200ms", "--ttl", "600ms",
		"--scale-workers", "12", "--scale-clients", "3", "--names", "20", "--name-workers", "3", "--name-clients", "2",
		"--json", jsonFile, "--svg", svgFile}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, &errb)
	}
	if errb.Len() > 0 {
		t.Errorf("stderr is not a terminal, yet: %q", &errb)
	}
	table := out.String()
	for _, row := range []string{"| mem |", "| file |", "| mem#2 |"} {
		if !strings.Contains(table, row) {
			t.Errorf("no row %q in:\n%s", row, table)
		}
	}
	var rep benchReport
	b, err := os.ReadFile(jsonFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("JSON: %v", err)
	}
	if len(rep.Results) != 3 || rep.Results[1].Held == nil || rep.Results[1].Held.Locks != 200 || rep.Machine.CPUs == 0 {
		t.Fatalf("JSON report: %s", b)
	}
	// The contended figures of internal/bench's harness, round trip included.
	if k := rep.Results[1].Contended; k == nil || k.Acquisitions == 0 || k.WaitP99 <= 0 || k.RoundTrip <= 0 || k.RoundTripOp != "refused TryAcquire" {
		t.Errorf("contended figures: %+v", k)
	}
	// The raw floor (mem and file have one); the scale workloads at the
	// sizes asked for, tries counted (file's by the driver, mem's by the
	// Client).
	for i, r := range rep.Results {
		if from := []string{bench.TriesClient, bench.TriesStore, bench.TriesClient}[i]; r.Scale != nil && r.Scale.TriesFrom != from {
			t.Errorf("%s: tries from %q, want %q", r.Backend, r.Scale.TriesFrom, from)
		}
		a := r.Floor.Subject("acquire")
		if a == nil || a.VsDriver.Rounds == 0 || !r.Floor.Supported || a.VsFloor.Rounds == 0 {
			t.Errorf("%s: floor %+v", r.Backend, r.Floor)
		}
		if r.ScaleFew == nil || r.ScaleFew.Workers != 3 || r.Scale == nil || r.Scale.Workers != 12 || r.Scale.Clients != 3 ||
			r.Names == nil || r.Names.Names != 20 || r.Names.Workers != 60 || r.Names.Clients != 2 || (r.Scale.TryCalls == 0) != (r.Scale.TriesFrom == bench.TriesNone) {
			t.Errorf("%s: scale %+v %+v %+v", r.Backend, r.ScaleFew, r.Scale, r.Names)
		}
	}
	for _, r := range rep.Results {
		// Crossed orders must finish: a set not taken in 10s is a deadlock.
		if s := r.LockSet; s == nil || s.Set.Cycles == 0 || s.Crossed.Cycles == 0 || s.Crossed.Errors != 0 {
			t.Errorf("%s: lock sets %+v", r.Backend, s)
		}
	}
	if c := rep.Config; c.ScaleWorkers != 12 || c.Names != 20 || len(c.Workloads) != len(bench.Workloads) {
		t.Errorf("config %+v", c)
	}
	for _, col := range []string{"| round trip | handoff/rtt | wait p99 |", "| retake |", "| ×floor |",
		"| floor p50 | driver | acquire | try | try-kept | try-noauto | slow: floor |", "| 12 workers: acq/s | wait p99 | CPU/acq | tries/acq |", "| 20 names: acq/s |", "| 4 names p50 | ×one | crossed: sets/s | p99 | not taken |"} {
		if !strings.Contains(table, col) {
			t.Errorf("no column %q in:\n%s", col, table)
		}
	}
	svg, err := os.ReadFile(svgFile)
	if err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(bytes.NewReader(svg))
	for {
		if _, err := d.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("SVG is not well-formed: %v", err)
		}
	}
	if !bytes.Contains(svg, []byte("<svg")) || bytes.Count(svg, []byte("<rect")) < 6*3 {
		t.Errorf("SVG has no bars:\n%s", svg)
	}
}

func TestBenchBadInput(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"bench", "--held", "0"},
		{"bench", "--backends", "nourl"},
		{"bench", "extra"},
		{"bench", "--workloads", "held,bogus"},
		{"bench", "--names", "0"},
	} {
		var out, errb bytes.Buffer
		if code := lockctl(args, &out, &errb); code != exitUsage || errb.Len() == 0 {
			t.Errorf("%q: exit %d, stderr %q", args, code, &errb)
		}
	}
	// An unreachable backend is reported and skipped; the exit status says so.
	var out, errb bytes.Buffer
	code := lockctl([]string{"bench", "--backends", "redis://127.0.0.1:1/0?dial_timeout=200ms,mem://", "--duration", "50ms",
		"--held", "10", "--held-for", "50ms", "--ttl", "300ms"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "redis") || !strings.Contains(out.String(), "| mem |") {
		t.Errorf("unreachable backend: exit %d, stderr %q, table:\n%s", code, &errb, &out)
	}
}

func TestRejoinTargets(t *testing.T) {
	got := rejoinTargets([]benchTarget{{url: "etcd://a:2379"}, {url: "b:2379"}, {url: "mem://"}, {url: "file:rel"}, {url: "redis+quorum://h:1"}, {url: "h:2/0"}})
	var urls []string
	for _, g := range got {
		urls = append(urls, g.url)
	}
	if strings.Join(urls, " ") != "etcd://a:2379,b:2379 mem:// file:rel redis+quorum://h:1,h:2/0" {
		t.Errorf("rejoined: %q", urls)
	}
}

// --workloads runs those alone; the tables of the others are left out.
func TestBenchWorkloads(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	code := lockctl([]string{"bench", "--backends", "mem://w", "--workloads", "scale, uncontended", "--duration", "50ms",
		"--scale-workers", "6", "--scale-clients", "2"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, &errb)
	}
	table := out.String()
	for _, want := range []string{"| mem |", "| floor p50 |", "| 6 workers: acq/s |"} {
		if !strings.Contains(table, want) {
			t.Errorf("no %q in:\n%s", want, table)
		}
	}
	for _, not := range []string{"semaphore of", "error"} {
		if strings.Contains(table, not) {
			t.Errorf("%q in:\n%s", not, table)
		}
	}
}
