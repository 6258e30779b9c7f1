package faults

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/lockerhq/locker/internal/testenv"
)

// etcdLeader returns the etcd member that leads now (asked through the
// members' HTTP gateway), or nil if none answers.
func etcdLeader(cl *client) []*testenv.Server {
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Second}
	for _, s := range cl.e.servers {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+s.Addr+"/v3/maintenance/status", strings.NewReader("{}"))
		resp, err := hc.Do(req)
		if err != nil {
			cancel()
			continue
		}
		var st struct {
			Header struct {
				MemberID string `json:"member_id"`
			} `json:"header"`
			Leader string `json:"leader"`
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		cancel()
		if err == nil && st.Leader != "" && st.Leader == st.Header.MemberID {
			return []*testenv.Server{s}
		}
	}
	return nil
}
