// Command hcloud-fidelity shows that the official Hetzner Cloud Go client (hcloud-go) accepts what
// an API server says: it runs the calls baton relies on (Floating IPs listed by label selector
// across pages, created, relabelled, assigned and unassigned through the action waiter, deleted;
// servers listed and looked up; error codes; rate-limit headers) and checks each answer as
// hcloud-go decoded it.
//
//	HCLOUD_ENDPOINT=http://127.0.0.1:PORT/v1 HCLOUD_TOKEN=... hcloud-fidelity
//
// Every check prints "ok <name>" or "FAIL <name>: <why>"; the exit status is 1 when any failed.
// The token is read from the environment only and never printed. Everything the program creates
// carries the label fidelity-run=<random id> and is deleted at the end, whatever failed before.
//
// Environment:
//
//	HCLOUD_ENDPOINT               the API's base URL, with its /v1 (required)
//	HCLOUD_TOKEN                  the project's API token (required)
//	HCLOUD_FIDELITY_RATE_LIMIT    the bucket size RateLimit-Limit must show (default 3600)
//	HCLOUD_FIDELITY_FAIL_SERVER   the name of a server whose assign actions the API ends in
//	                              "error" (the simulator's setting); unset: that check is skipped
//	                              with a "skip" line
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"
)

// Application is the User-Agent's product, so a simulator's request log shows who asked.
const Application = "baton-hcloud-fidelity"

func main() {
	os.Exit(run())
}

func run() int {
	cfg, err := configFromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hcloud-fidelity: %v\n", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := newSuite(cfg, os.Stdout)
	failed := s.Run(ctx)
	if failed > 0 {
		fmt.Fprintf(os.Stdout, "%d checks failed\n", failed)
		return 1
	}
	fmt.Fprintln(os.Stdout, "all checks passed")
	return 0
}

// config is what the program reads from its environment.
type config struct {
	endpoint   string
	token      string
	rateLimit  int
	failServer string
}

func configFromEnv(getenv func(string) string) (config, error) {
	cfg := config{
		endpoint:   getenv("HCLOUD_ENDPOINT"),
		token:      getenv("HCLOUD_TOKEN"),
		rateLimit:  3600,
		failServer: getenv("HCLOUD_FIDELITY_FAIL_SERVER"),
	}
	if cfg.endpoint == "" {
		return cfg, fmt.Errorf("HCLOUD_ENDPOINT is not set (the API's base URL, e.g. http://127.0.0.1:8080/v1)")
	}
	if cfg.token == "" {
		return cfg, fmt.Errorf("HCLOUD_TOKEN is not set")
	}
	if v := getenv("HCLOUD_FIDELITY_RATE_LIMIT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return cfg, fmt.Errorf("HCLOUD_FIDELITY_RATE_LIMIT=%q: want a positive integer", v)
		}
		cfg.rateLimit = n
	}
	return cfg, nil
}

// newClient is the client as a user builds it, polling actions every 50 ms (the default waiter
// starts at one second) and retrying what hcloud-go retries by default, sooner.
func newClient(endpoint, token string) *hcloud.Client {
	return hcloud.NewClient(
		hcloud.WithEndpoint(endpoint),
		hcloud.WithToken(token),
		hcloud.WithApplication(Application, ""),
		hcloud.WithPollOpts(hcloud.PollOpts{BackoffFunc: hcloud.ConstantBackoff(50 * time.Millisecond)}),
		hcloud.WithRetryOpts(hcloud.RetryOpts{BackoffFunc: hcloud.ExponentialBackoff(2, 100*time.Millisecond), MaxRetries: 5}),
	)
}
