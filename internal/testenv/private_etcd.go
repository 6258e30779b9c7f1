package testenv

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// StartEtcdWith starts a private single-member etcd, as StartEtcd does,
// with extra arguments on the command line (a deliberately misconfigured
// server, for lockctl doctor's checks).
func StartEtcdWith(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin := needBinary(t, "etcd")
	ps := FreePorts(t, 2)
	client, peer := ps[0], ps[1]
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	s := &Server{Kind: "etcd", Name: "etcd-1", Addr: loopback(client), Ports: []int{peer}, dir: t.TempDir(), startIn: 30 * time.Second}
	s.command = func() *exec.Cmd {
		return exec.Command(bin, append([]string{"--name", "m1", "--data-dir", filepath.Join(s.dir, "data"),
			"--listen-client-urls", "http://" + s.Addr, "--advertise-client-urls", "http://" + s.Addr,
			"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
			"--initial-cluster", "m1=" + peerURL, "--initial-cluster-token", fmt.Sprintf("locker-private-%d", client),
			"--initial-cluster-state", "new", "--logger", "zap", "--log-outputs", "stderr"}, extra...)...)
	}
	s.ready = etcdHealthy
	return startGroup(t, []*Server{s})[0]
}
