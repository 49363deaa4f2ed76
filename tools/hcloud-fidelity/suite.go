package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"
)

// The labels of everything the program creates.
const (
	runLabel  = "fidelity-run" // this run's random id: the clean-up's selector
	kindLabel = "kind"         // "bulk" on the list's Floating IPs; absent on the probe
	tierLabel = "tier"         // a, b, c in turn on the bulk ones
	oddLabel  = "odd"          // "yes" on every second bulk one; absent on the others
	roleLabel = "role"         // "probe" on the probe
)

// bulkCount Floating IPs take two pages at hcloud-go's PerPage of 50.
const bulkCount = 60

// missingID is an id no object has (the simulator counts from 1).
const missingID = 987654321

// suite holds one run's client and what its checks found and made.
type suite struct {
	cfg    config
	client *hcloud.Client
	out    io.Writer
	run    string
	failed int

	servers  []*hcloud.Server
	location string             // the home location of the Floating IPs: the first server's
	probe    *hcloud.FloatingIP // created, relabelled, assigned, unassigned
	bulk     []*hcloud.FloatingIP
	created  []int64 // every Floating IP created, in order, for the clean-up
}

func newSuite(cfg config, out io.Writer) *suite {
	var id [6]byte
	_, _ = rand.Read(id[:])
	return &suite{
		cfg:    cfg,
		client: newClient(cfg.endpoint, cfg.token),
		out:    out,
		run:    hex.EncodeToString(id[:]),
	}
}

type check struct {
	name string
	fn   func(context.Context) error
}

// errSkip ends a check that the API's settings do not allow here ("skip <name>: <why>").
type errSkip struct{ why string }

func (e errSkip) Error() string { return e.why }

// Run runs every check in order, then the clean-up (whatever failed), and returns how many
// failed.
func (s *suite) Run(ctx context.Context) int {
	fmt.Fprintf(s.out, "run %s=%s against %s\n", runLabel, s.run, s.cfg.endpoint)
	checks := []check{
		{"servers", s.checkServers},
		{"floating-ip-create", s.checkCreate},
		{"floating-ip-update-labels", s.checkUpdateLabels},
		{"floating-ip-list-pages", s.checkListPages},
		{"label-selectors", s.checkSelectors},
		{"assign-then-wait", s.checkAssign},
		{"unassign-then-wait", s.checkUnassign},
		{"assign-while-running-is-locked", s.checkLocked},
		{"error-not-found", s.checkNotFound},
		{"error-invalid-input", s.checkInvalidInput},
		{"error-unauthorized", s.checkUnauthorized},
		{"action-error", s.checkActionError},
		{"rate-limit-headers", s.checkRateLimit},
	}
	for _, c := range checks {
		s.runCheck(ctx, c)
	}
	// The clean-up gets its own time: a run that used up its context still deletes.
	cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	s.runCheck(cleanupCtx, check{"cleanup", s.cleanup})
	return s.failed
}

func (s *suite) runCheck(ctx context.Context, c check) {
	err := c.fn(ctx)
	var skip errSkip
	switch {
	case err == nil:
		fmt.Fprintf(s.out, "ok %s\n", c.name)
	case errors.As(err, &skip):
		fmt.Fprintf(s.out, "skip %s: %s\n", c.name, skip.why)
	default:
		s.failed++
		fmt.Fprintf(s.out, "FAIL %s: %v\n", c.name, err)
	}
}

// needServers is the error of a check that needs n servers when the servers check found fewer.
func (s *suite) needServers(n int) error {
	if len(s.servers) < n {
		return fmt.Errorf("needs %d servers, the servers check found %d", n, len(s.servers))
	}
	return nil
}

// createFIP creates an IPv4 Floating IP in the run's location and remembers it for the
// clean-up.
func (s *suite) createFIP(ctx context.Context, name string, labels map[string]string) (hcloud.FloatingIPCreateResult, error) {
	description := "hcloud-fidelity " + s.run
	res, _, err := s.client.FloatingIP.Create(ctx, hcloud.FloatingIPCreateOpts{
		Type:         hcloud.FloatingIPTypeIPv4,
		HomeLocation: &hcloud.Location{Name: s.location},
		Description:  &description,
		Name:         &name,
		Labels:       labels,
	})
	if err != nil {
		return res, fmt.Errorf("FloatingIP.Create %s: %w", name, err)
	}
	if res.FloatingIP == nil || res.FloatingIP.ID == 0 {
		return res, fmt.Errorf("FloatingIP.Create %s: no floating_ip.id in the answer", name)
	}
	s.created = append(s.created, res.FloatingIP.ID)
	return res, nil
}

// wait runs hcloud-go's action waiter on one action, bounded.
func (s *suite) wait(ctx context.Context, action *hcloud.Action) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return s.client.Action.WaitFor(ctx, action)
}
