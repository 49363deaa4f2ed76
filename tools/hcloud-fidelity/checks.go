package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"
)

// checkServers: Server.All, GetByID and GetByName decode each server with its location and
// public IPv4; a missing id is (nil, nil), as hcloud-go turns a 404 into "not found" for getters.
func (s *suite) checkServers(ctx context.Context) error {
	servers, err := s.client.Server.All(ctx)
	if err != nil {
		return fmt.Errorf("Server.All: %w", err)
	}
	if len(servers) == 0 {
		return errors.New("Server.All: no servers (the API's project must have at least one)")
	}
	for _, srv := range servers {
		if err := serverComplete(srv); err != nil {
			return fmt.Errorf("Server.All: %w", err)
		}
	}
	first := servers[0]
	byID, _, err := s.client.Server.GetByID(ctx, first.ID)
	if err != nil {
		return fmt.Errorf("Server.GetByID(%d): %w", first.ID, err)
	}
	if byID == nil {
		return fmt.Errorf("Server.GetByID(%d): nil (a 404) for a server Server.All listed", first.ID)
	}
	if err := sameServer(first, byID); err != nil {
		return fmt.Errorf("Server.GetByID(%d): %w", first.ID, err)
	}
	byName, _, err := s.client.Server.GetByName(ctx, first.Name)
	if err != nil {
		return fmt.Errorf("Server.GetByName(%q): %w", first.Name, err)
	}
	if byName == nil {
		return fmt.Errorf("Server.GetByName(%q): nil (the list by name= was empty)", first.Name)
	}
	if err := sameServer(first, byName); err != nil {
		return fmt.Errorf("Server.GetByName(%q): %w", first.Name, err)
	}
	if srv, _, err := s.client.Server.GetByName(ctx, "fidelity-no-such-server-"+s.run); err != nil || srv != nil {
		return fmt.Errorf("Server.GetByName of an unknown name: got (%v, %v), want (nil, nil)", serverName(srv), err)
	}
	s.servers = servers
	s.location = first.Location.Name
	return nil
}

func serverComplete(srv *hcloud.Server) error {
	switch {
	case srv.ID == 0 || srv.Name == "":
		return fmt.Errorf("a server without id or name: %+v", srv)
	case srv.Location == nil || srv.Location.Name == "":
		return fmt.Errorf("server %s: no location.name", srv.Name)
	case srv.Location.NetworkZone == "":
		return fmt.Errorf("server %s: location %s has no network_zone", srv.Name, srv.Location.Name)
	case srv.PublicNet.IPv4.IP == nil || srv.PublicNet.IPv4.IP.To4() == nil:
		return fmt.Errorf("server %s: public_net.ipv4.ip is not an IPv4 address (%v)", srv.Name, srv.PublicNet.IPv4.IP)
	case srv.Created.IsZero():
		return fmt.Errorf("server %s: no created time", srv.Name)
	case srv.Status == "":
		return fmt.Errorf("server %s: no status", srv.Name)
	}
	return nil
}

func sameServer(want, got *hcloud.Server) error {
	if got.ID != want.ID || got.Name != want.Name {
		return fmt.Errorf("got server %d %q, want %d %q", got.ID, got.Name, want.ID, want.Name)
	}
	if err := serverComplete(got); err != nil {
		return err
	}
	if got.Location.Name != want.Location.Name || !got.PublicNet.IPv4.IP.Equal(want.PublicNet.IPv4.IP) {
		return fmt.Errorf("server %s: location %s ip %v, the list said %s %v", got.Name,
			got.Location.Name, got.PublicNet.IPv4.IP, want.Location.Name, want.PublicNet.IPv4.IP)
	}
	return nil
}

func serverName(srv *hcloud.Server) string {
	if srv == nil {
		return "<nil>"
	}
	return srv.Name
}

// checkCreate: FloatingIP.Create with a home location, a name, a description and labels; the
// answer and GetByID / GetByName show them.
func (s *suite) checkCreate(ctx context.Context) error {
	if err := s.needServers(1); err != nil {
		return err
	}
	labels := map[string]string{runLabel: s.run, roleLabel: "probe", "stage": "created"}
	name := "fidelity-" + s.run + "-probe"
	res, err := s.createFIP(ctx, name, labels)
	if err != nil {
		return err
	}
	fip := res.FloatingIP
	if res.Action != nil {
		return fmt.Errorf("created without a server, yet the answer has an action %d (%s)", res.Action.ID, res.Action.Command)
	}
	if err := fipShows(fip, name, s.location, labels); err != nil {
		return fmt.Errorf("FloatingIP.Create: %w", err)
	}
	got, _, err := s.client.FloatingIP.GetByID(ctx, fip.ID)
	if err != nil {
		return fmt.Errorf("FloatingIP.GetByID(%d): %w", fip.ID, err)
	}
	if got == nil {
		return fmt.Errorf("FloatingIP.GetByID(%d): nil (a 404) right after the create", fip.ID)
	}
	if err := fipShows(got, name, s.location, labels); err != nil {
		return fmt.Errorf("FloatingIP.GetByID: %w", err)
	}
	if !got.IP.Equal(fip.IP) {
		return fmt.Errorf("FloatingIP.GetByID: ip %v, the create said %v", got.IP, fip.IP)
	}
	byName, _, err := s.client.FloatingIP.GetByName(ctx, name)
	if err != nil || byName == nil || byName.ID != fip.ID {
		return fmt.Errorf("FloatingIP.GetByName(%q): got (%v, %v), want id %d", name, fipID(byName), err, fip.ID)
	}
	s.probe = got
	return nil
}

func fipShows(fip *hcloud.FloatingIP, name, location string, labels map[string]string) error {
	switch {
	case fip.Name != name:
		return fmt.Errorf("name %q, want %q", fip.Name, name)
	case fip.Type != hcloud.FloatingIPTypeIPv4:
		return fmt.Errorf("type %q, want ipv4", fip.Type)
	case fip.IP == nil || fip.IP.To4() == nil:
		return fmt.Errorf("ip %v is not an IPv4 address", fip.IP)
	case fip.HomeLocation == nil || fip.HomeLocation.Name != location:
		return fmt.Errorf("home_location %v, want %s", fip.HomeLocation, location)
	case fip.HomeLocation.NetworkZone == "":
		return fmt.Errorf("home_location %s has no network_zone", fip.HomeLocation.Name)
	case fip.Server != nil:
		return fmt.Errorf("server %d, want null (never assigned)", fip.Server.ID)
	case fip.Created.IsZero():
		return errors.New("no created time")
	case time.Since(fip.Created).Abs() > 10*time.Minute:
		return fmt.Errorf("created %s, not now (%s)", fip.Created.Format(time.RFC3339), time.Now().UTC().Format(time.RFC3339))
	case !maps.Equal(fip.Labels, labels):
		return fmt.Errorf("labels %v, want %v", fip.Labels, labels)
	case !strings.Contains(fip.Description, "hcloud-fidelity"):
		return fmt.Errorf("description %q, want the one sent", fip.Description)
	}
	return nil
}

func fipID(fip *hcloud.FloatingIP) string {
	if fip == nil {
		return "<nil>"
	}
	return fmt.Sprint(fip.ID)
}

// checkUpdateLabels: Update replaces the labels as a whole (a label left out is gone), and
// GetByID shows the new set.
func (s *suite) checkUpdateLabels(ctx context.Context) error {
	if s.probe == nil {
		return errors.New("needs the probe Floating IP (floating-ip-create failed)")
	}
	labels := map[string]string{runLabel: s.run, roleLabel: "probe", "stage": "updated", "owner": "baton"}
	updated, _, err := s.client.FloatingIP.Update(ctx, s.probe, hcloud.FloatingIPUpdateOpts{Labels: labels})
	if err != nil {
		return fmt.Errorf("FloatingIP.Update: %w", err)
	}
	if updated == nil || !maps.Equal(updated.Labels, labels) {
		return fmt.Errorf("FloatingIP.Update answered labels %v, want %v", labelsOf(updated), labels)
	}
	// Replaced as a whole: a smaller set drops the labels left out.
	smaller := map[string]string{runLabel: s.run, roleLabel: "probe"}
	if _, _, err := s.client.FloatingIP.Update(ctx, s.probe, hcloud.FloatingIPUpdateOpts{Labels: smaller}); err != nil {
		return fmt.Errorf("FloatingIP.Update (fewer labels): %w", err)
	}
	got, _, err := s.client.FloatingIP.GetByID(ctx, s.probe.ID)
	if err != nil || got == nil {
		return fmt.Errorf("FloatingIP.GetByID(%d): (%v, %v)", s.probe.ID, fipID(got), err)
	}
	if !maps.Equal(got.Labels, smaller) {
		return fmt.Errorf("after an update with %v, GetByID shows labels %v (labels are replaced as a whole)", smaller, got.Labels)
	}
	if got.Description == "" || got.Name != s.probe.Name {
		return fmt.Errorf("an update of the labels changed name %q or description %q", got.Name, got.Description)
	}
	s.probe = got
	return nil
}

func labelsOf(fip *hcloud.FloatingIP) map[string]string {
	if fip == nil {
		return nil
	}
	return fip.Labels
}

func bulkLabels(run string, i int) map[string]string {
	l := map[string]string{runLabel: run, kindLabel: "bulk", tierLabel: string(rune('a' + i%3))}
	if i%2 == 1 {
		l[oddLabel] = "yes"
	}
	return l
}

// checkListPages: 60 Floating IPs with labels, listed by a label selector one page at a time
// (meta.pagination as hcloud-go reads it) and with AllWithOpts, which follows next_page.
func (s *suite) checkListPages(ctx context.Context) error {
	if err := s.needServers(1); err != nil {
		return err
	}
	for i := range bulkCount {
		res, err := s.createFIP(ctx, fmt.Sprintf("fidelity-%s-bulk-%02d", s.run, i), bulkLabels(s.run, i))
		if err != nil {
			return err
		}
		s.bulk = append(s.bulk, res.FloatingIP)
	}
	selector := runLabel + "=" + s.run + "," + kindLabel + "=bulk"
	opts := func(page, perPage int) hcloud.FloatingIPListOpts {
		return hcloud.FloatingIPListOpts{ListOpts: hcloud.ListOpts{Page: page, PerPage: perPage, LabelSelector: selector}}
	}
	type pageWant struct {
		page, perPage, entries int
		want                   hcloud.Pagination
		what                   string
	}
	pages := []pageWant{
		{1, 50, 50, hcloud.Pagination{Page: 1, PerPage: 50, NextPage: 2, LastPage: 2, TotalEntries: bulkCount}, "page 1 of 2"},
		{2, 50, 10, hcloud.Pagination{Page: 2, PerPage: 50, PreviousPage: 1, LastPage: 2, TotalEntries: bulkCount}, "page 2 of 2"},
		// No per_page: the API's default of 25.
		{0, 0, 25, hcloud.Pagination{Page: 1, PerPage: 25, NextPage: 2, LastPage: 3, TotalEntries: bulkCount}, "default page size"},
	}
	seen := map[int64]bool{}
	for _, p := range pages {
		list, resp, err := s.client.FloatingIP.List(ctx, opts(p.page, p.perPage))
		if err != nil {
			return fmt.Errorf("FloatingIP.List %s: %w", p.what, err)
		}
		if len(list) != p.entries {
			return fmt.Errorf("FloatingIP.List %s: %d Floating IPs, want %d", p.what, len(list), p.entries)
		}
		if resp.Meta.Pagination == nil {
			return fmt.Errorf("FloatingIP.List %s: no meta.pagination in the answer", p.what)
		}
		if *resp.Meta.Pagination != p.want {
			return fmt.Errorf("FloatingIP.List %s: meta.pagination %+v, want %+v", p.what, *resp.Meta.Pagination, p.want)
		}
		if p.perPage == 50 {
			for _, f := range list {
				if seen[f.ID] {
					return fmt.Errorf("FloatingIP.List: id %d on both pages", f.ID)
				}
				seen[f.ID] = true
			}
		}
	}
	if len(seen) != bulkCount {
		return fmt.Errorf("the two pages hold %d distinct Floating IPs, want %d", len(seen), bulkCount)
	}
	for _, perPage := range []int{0, 7} { // 0: hcloud-go's 50 (two pages); 7: nine pages
		all, err := s.client.FloatingIP.AllWithOpts(ctx, opts(0, perPage))
		if err != nil {
			return fmt.Errorf("FloatingIP.AllWithOpts(PerPage %d): %w", perPage, err)
		}
		if err := sameIDs(all, s.bulk); err != nil {
			return fmt.Errorf("FloatingIP.AllWithOpts(%q, PerPage %d): %w", selector, perPage, err)
		}
	}
	return nil
}

// checkSelectors: each selector form (k=v, k!=v, k, !k, k in (..), k notin (..)) selects exactly
// the right Floating IPs.
func (s *suite) checkSelectors(ctx context.Context) error {
	if len(s.bulk) != bulkCount || s.probe == nil {
		return errors.New("needs the probe and the bulk Floating IPs (an earlier check failed)")
	}
	pick := func(keep func(i int, l map[string]string) bool) []*hcloud.FloatingIP {
		var out []*hcloud.FloatingIP
		for i, f := range s.bulk {
			if keep(i, bulkLabels(s.run, i)) {
				out = append(out, f)
			}
		}
		return out
	}
	run := runLabel + "=" + s.run
	cases := []struct {
		selector string
		want     []*hcloud.FloatingIP
	}{
		{run, append(pick(func(int, map[string]string) bool { return true }), s.probe)},
		{run + ",kind=bulk,tier=a", pick(func(_ int, l map[string]string) bool { return l[tierLabel] == "a" })},
		{run + ",kind=bulk,tier!=a", pick(func(_ int, l map[string]string) bool { return l[tierLabel] != "a" })},
		{run + ",kind=bulk,odd", pick(func(i int, _ map[string]string) bool { return i%2 == 1 })},
		{run + ",kind=bulk,!odd", pick(func(i int, _ map[string]string) bool { return i%2 == 0 })},
		{run + ",tier in (a,b)", pick(func(_ int, l map[string]string) bool { return l[tierLabel] != "c" })},
		{run + ",kind=bulk,tier notin (a,b)", pick(func(_ int, l map[string]string) bool { return l[tierLabel] == "c" })},
		{run + ",!kind", []*hcloud.FloatingIP{s.probe}},
		{run + ",role=probe", []*hcloud.FloatingIP{s.probe}},
		{run + ",tier=a,odd=yes", pick(func(i int, l map[string]string) bool { return l[tierLabel] == "a" && i%2 == 1 })},
	}
	for _, c := range cases {
		all, err := s.client.FloatingIP.AllWithOpts(ctx, hcloud.FloatingIPListOpts{ListOpts: hcloud.ListOpts{LabelSelector: c.selector}})
		if err != nil {
			return fmt.Errorf("FloatingIP.AllWithOpts(%q): %w", c.selector, err)
		}
		if err := sameIDs(all, c.want); err != nil {
			return fmt.Errorf("label_selector %q: %w", c.selector, err)
		}
	}
	return nil
}

func sameIDs(got, want []*hcloud.FloatingIP) error {
	ids := func(l []*hcloud.FloatingIP) []int64 {
		out := make([]int64, 0, len(l))
		for _, f := range l {
			out = append(out, f.ID)
		}
		slices.Sort(out)
		return out
	}
	g, w := ids(got), ids(want)
	if slices.Equal(g, w) {
		return nil
	}
	extra, missing := diff(g, w), diff(w, g)
	return fmt.Errorf("%d Floating IPs, want %d (not wanted: %v; missing: %v)", len(g), len(w), extra, missing)
}

// diff is a minus b.
func diff(a, b []int64) []int64 {
	var out []int64
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

// checkAssign: Assign answers a running action, hcloud-go's waiter follows it to success, and the
// Floating IP and the server then show each other.
func (s *suite) checkAssign(ctx context.Context) error {
	if s.probe == nil {
		return errors.New("needs the probe Floating IP (floating-ip-create failed)")
	}
	srv := s.servers[0]
	action, _, err := s.client.FloatingIP.Assign(ctx, s.probe, srv)
	if err != nil {
		return fmt.Errorf("FloatingIP.Assign(%d, server %d): %w", s.probe.ID, srv.ID, err)
	}
	if err := actionShows(action, "assign_floating_ip", s.probe.ID); err != nil {
		return fmt.Errorf("FloatingIP.Assign: %w", err)
	}
	if err := s.wait(ctx, action); err != nil {
		return fmt.Errorf("Action.WaitFor(assign %d): %w", action.ID, err)
	}
	if err := s.actionSucceeded(ctx, action.ID); err != nil {
		return err
	}
	got, _, err := s.client.FloatingIP.GetByID(ctx, s.probe.ID)
	if err != nil || got == nil {
		return fmt.Errorf("FloatingIP.GetByID(%d): (%v, %v)", s.probe.ID, fipID(got), err)
	}
	if got.Server == nil || got.Server.ID != srv.ID {
		return fmt.Errorf("after the assign succeeded, server is %v, want %d", serverID(got.Server), srv.ID)
	}
	holder, _, err := s.client.Server.GetByID(ctx, srv.ID)
	if err != nil || holder == nil {
		return fmt.Errorf("Server.GetByID(%d): (%v, %v)", srv.ID, serverName(holder), err)
	}
	if !slices.ContainsFunc(holder.PublicNet.FloatingIPs, func(f *hcloud.FloatingIP) bool { return f.ID == s.probe.ID }) {
		return fmt.Errorf("server %s: public_net.floating_ips %v lacks the assigned %d", srv.Name, fipIDs(holder.PublicNet.FloatingIPs), s.probe.ID)
	}
	s.probe = got
	return nil
}

// checkUnassign: Unassign, the waiter, and GetByID shows no server.
func (s *suite) checkUnassign(ctx context.Context) error {
	if s.probe == nil || s.probe.Server == nil {
		return errors.New("needs the probe assigned (assign-then-wait failed)")
	}
	holderID := s.probe.Server.ID
	action, _, err := s.client.FloatingIP.Unassign(ctx, s.probe)
	if err != nil {
		return fmt.Errorf("FloatingIP.Unassign(%d): %w", s.probe.ID, err)
	}
	if err := actionShows(action, "unassign_floating_ip", s.probe.ID); err != nil {
		return fmt.Errorf("FloatingIP.Unassign: %w", err)
	}
	if err := s.wait(ctx, action); err != nil {
		return fmt.Errorf("Action.WaitFor(unassign %d): %w", action.ID, err)
	}
	if err := s.actionSucceeded(ctx, action.ID); err != nil {
		return err
	}
	got, _, err := s.client.FloatingIP.GetByID(ctx, s.probe.ID)
	if err != nil || got == nil {
		return fmt.Errorf("FloatingIP.GetByID(%d): (%v, %v)", s.probe.ID, fipID(got), err)
	}
	if got.Server != nil {
		return fmt.Errorf("after the unassign succeeded, server is %d, want null", got.Server.ID)
	}
	holder, _, err := s.client.Server.GetByID(ctx, holderID)
	if err != nil || holder == nil {
		return fmt.Errorf("Server.GetByID(%d): (%v, %v)", holderID, serverName(holder), err)
	}
	if slices.ContainsFunc(holder.PublicNet.FloatingIPs, func(f *hcloud.FloatingIP) bool { return f.ID == s.probe.ID }) {
		return fmt.Errorf("server %s: public_net.floating_ips %v still lists the unassigned %d", holder.Name, fipIDs(holder.PublicNet.FloatingIPs), s.probe.ID)
	}
	s.probe = got
	return nil
}

// checkLocked: a second assign while the first one's action runs is refused with "locked" (423),
// and the first one still completes.
func (s *suite) checkLocked(ctx context.Context) error {
	if len(s.bulk) == 0 {
		return errors.New("needs the bulk Floating IPs (floating-ip-list-pages failed)")
	}
	fip, first := s.bulk[0], s.servers[0]
	second := first
	if len(s.servers) > 1 {
		second = s.servers[1]
	}
	action, _, err := s.client.FloatingIP.Assign(ctx, fip, first)
	if err != nil {
		return fmt.Errorf("FloatingIP.Assign(%d, server %d): %w", fip.ID, first.ID, err)
	}
	if action.Status != hcloud.ActionStatusRunning {
		return fmt.Errorf("the assign action answered %q, not running: the API's action time must be above zero for this check", action.Status)
	}
	_, resp, err := s.client.FloatingIP.Assign(ctx, fip, second)
	lockErr := err
	if err := s.wait(ctx, action); err != nil {
		return fmt.Errorf("Action.WaitFor(assign %d): %w", action.ID, err)
	}
	if !hcloud.IsError(lockErr, hcloud.ErrorCodeLocked) {
		return fmt.Errorf("a second assign while action %d runs: got %v (%s), want an hcloud.Error with code locked", action.ID, errOrNil(lockErr), status(resp))
	}
	if resp == nil || resp.StatusCode != http.StatusLocked {
		return fmt.Errorf("a second assign while action %d runs: status %s, want 423", action.ID, status(resp))
	}
	got, _, err := s.client.FloatingIP.GetByID(ctx, fip.ID)
	if err != nil || got == nil || got.Server == nil || got.Server.ID != first.ID {
		return fmt.Errorf("after the first assign succeeded: FloatingIP.GetByID(%d) = (server %v, %v), want server %d", fip.ID, serverIDOf(got), err, first.ID)
	}
	unassign, _, err := s.client.FloatingIP.Unassign(ctx, fip)
	if err != nil {
		return fmt.Errorf("FloatingIP.Unassign(%d): %w", fip.ID, err)
	}
	if err := s.wait(ctx, unassign); err != nil {
		return fmt.Errorf("Action.WaitFor(unassign %d): %w", unassign.ID, err)
	}
	return nil
}

// checkNotFound: getters answer (nil, nil) for a 404, as hcloud-go documents; other calls give
// an hcloud.Error with code not_found.
func (s *suite) checkNotFound(ctx context.Context) error {
	fip, resp, err := s.client.FloatingIP.GetByID(ctx, missingID)
	if err != nil || fip != nil {
		return fmt.Errorf("FloatingIP.GetByID(missing): got (%v, %v), want (nil, nil)", fipID(fip), err)
	}
	if resp == nil || resp.StatusCode != http.StatusNotFound {
		return fmt.Errorf("FloatingIP.GetByID(missing): status %s, want 404", status(resp))
	}
	if srv, _, err := s.client.Server.GetByID(ctx, missingID); err != nil || srv != nil {
		return fmt.Errorf("Server.GetByID(missing): got (%v, %v), want (nil, nil)", serverName(srv), err)
	}
	if a, _, err := s.client.Action.GetByID(ctx, missingID); err != nil || a != nil {
		return fmt.Errorf("Action.GetByID(missing): got (%v, %v), want (nil, nil)", a, err)
	}
	resp, err = s.client.FloatingIP.Delete(ctx, &hcloud.FloatingIP{ID: missingID})
	if !hcloud.IsError(err, hcloud.ErrorCodeNotFound) {
		return fmt.Errorf("FloatingIP.Delete(missing): got %v (%s), want an hcloud.Error with code not_found", errOrNil(err), status(resp))
	}
	if len(s.servers) > 0 {
		_, resp, err = s.client.FloatingIP.Assign(ctx, &hcloud.FloatingIP{ID: missingID}, s.servers[0])
		if !hcloud.IsError(err, hcloud.ErrorCodeNotFound) {
			return fmt.Errorf("FloatingIP.Assign(missing, server %d): got %v (%s), want not_found", s.servers[0].ID, errOrNil(err), status(resp))
		}
	}
	return nil
}

// checkInvalidInput: a label value the API refuses gives invalid_input, with the field named in
// the error's details (hcloud.ErrorDetailsInvalidInput), and changes nothing. The status is not
// checked: hcloud-go goes by the code alone.
func (s *suite) checkInvalidInput(ctx context.Context) error {
	if s.probe == nil {
		return errors.New("needs the probe Floating IP (floating-ip-create failed)")
	}
	bad := map[string]string{runLabel: s.run, roleLabel: "not a valid value!"}
	_, resp, err := s.client.FloatingIP.Update(ctx, s.probe, hcloud.FloatingIPUpdateOpts{Labels: bad})
	if err := invalidLabels("FloatingIP.Update", err, resp); err != nil {
		return err
	}
	// hcloud-go reads the code, not the status; shown, not judged.
	fmt.Fprintf(s.out, "  (invalid_input came with status %s)\n", status(resp))
	got, _, err := s.client.FloatingIP.GetByID(ctx, s.probe.ID)
	if err != nil || got == nil {
		return fmt.Errorf("FloatingIP.GetByID(%d): (%v, %v)", s.probe.ID, fipID(got), err)
	}
	if !maps.Equal(got.Labels, s.probe.Labels) {
		return fmt.Errorf("a refused update changed the labels from %v to %v", s.probe.Labels, got.Labels)
	}
	// The same on create: nothing is created (the clean-up's final list would show it).
	name := "fidelity-" + s.run + "-invalid"
	description := "hcloud-fidelity " + s.run
	res, resp, err := s.client.FloatingIP.Create(ctx, hcloud.FloatingIPCreateOpts{
		Type: hcloud.FloatingIPTypeIPv4, HomeLocation: &hcloud.Location{Name: s.location},
		Name: &name, Description: &description, Labels: bad,
	})
	if res.FloatingIP != nil && res.FloatingIP.ID != 0 {
		s.created = append(s.created, res.FloatingIP.ID)
	}
	return invalidLabels("FloatingIP.Create", err, resp)
}

func invalidLabels(call string, err error, resp *hcloud.Response) error {
	if !hcloud.IsError(err, hcloud.ErrorCodeInvalidInput) {
		return fmt.Errorf("%s with a bad label value: got %v (%s), want an hcloud.Error with code invalid_input", call, errOrNil(err), status(resp))
	}
	var apiErr hcloud.Error
	errors.As(err, &apiErr)
	details, ok := apiErr.Details.(hcloud.ErrorDetailsInvalidInput)
	if !ok {
		return fmt.Errorf("%s: invalid_input's details decoded as %T, want hcloud.ErrorDetailsInvalidInput "+
			`(error.details must be {"fields": [{"name": "...", "messages": ["..."]}]})`, call, apiErr.Details)
	}
	var names []string
	for _, f := range details.Fields {
		names = append(names, f.Name)
		if strings.HasPrefix(f.Name, "labels") && len(f.Messages) > 0 {
			return nil
		}
	}
	return fmt.Errorf("%s: invalid_input's details.fields name %q, want a field named labels with a message", call, names)
}

// checkUnauthorized: a wrong token, and none, give unauthorized (401).
func (s *suite) checkUnauthorized(ctx context.Context) error {
	for _, token := range []string{"fidelity-wrong-token", ""} {
		what := "a wrong token"
		if token == "" {
			what = "no token"
		}
		_, resp, err := newClient(s.cfg.endpoint, token).FloatingIP.List(ctx, hcloud.FloatingIPListOpts{})
		if !hcloud.IsError(err, hcloud.ErrorCodeUnauthorized) {
			return fmt.Errorf("FloatingIP.List with %s: got %v (%s), want an hcloud.Error with code unauthorized", what, errOrNil(err), status(resp))
		}
		if resp == nil || resp.StatusCode != http.StatusUnauthorized {
			return fmt.Errorf("FloatingIP.List with %s: status %s, want 401", what, status(resp))
		}
	}
	return nil
}

// checkActionError: an assign action the API ends in "error" surfaces through the waiter as an
// hcloud.ActionError carrying the action's error code, and the Floating IP stays unassigned.
func (s *suite) checkActionError(ctx context.Context) error {
	if s.cfg.failServer == "" {
		return errSkip{"HCLOUD_FIDELITY_FAIL_SERVER is not set (no server whose actions the API fails)"}
	}
	if len(s.bulk) < 2 {
		return errors.New("needs the bulk Floating IPs (floating-ip-list-pages failed)")
	}
	srv, _, err := s.client.Server.GetByName(ctx, s.cfg.failServer)
	if err != nil || srv == nil {
		return fmt.Errorf("Server.GetByName(%q): (%v, %v)", s.cfg.failServer, serverName(srv), err)
	}
	fip := s.bulk[1]
	action, _, err := s.client.FloatingIP.Assign(ctx, fip, srv)
	if err != nil {
		return fmt.Errorf("FloatingIP.Assign(%d, server %s): %w", fip.ID, srv.Name, err)
	}
	err = s.wait(ctx, action)
	var actionErr hcloud.ActionError
	if !errors.As(err, &actionErr) {
		return fmt.Errorf("Action.WaitFor(assign %d to %s): got %v, want an hcloud.ActionError", action.ID, srv.Name, errOrNil(err))
	}
	if actionErr.Code == "" || actionErr.Code == "<unknown>" || actionErr.Message == "Unknown error" {
		return fmt.Errorf("the failed action's error has code %q message %q: error.code and error.message must be set", actionErr.Code, actionErr.Message)
	}
	if a := actionErr.Action(); a == nil || a.ID != action.ID || a.Finished.IsZero() {
		return fmt.Errorf("the ActionError's action %+v: want action %d with a finished time", a, action.ID)
	}
	got, _, err := s.client.FloatingIP.GetByID(ctx, fip.ID)
	if err != nil || got == nil || got.Server != nil {
		return fmt.Errorf("after a failed assign: FloatingIP.GetByID(%d) = (server %v, %v), want no server", fip.ID, serverIDOf(got), err)
	}
	fmt.Fprintf(s.out, "  (the failed action: %v)\n", actionErr)
	return nil
}

// checkRateLimit: every answer's RateLimit-* headers, as hcloud-go parses them into
// Response.Meta.Ratelimit: the bucket's size, what is left (falling with each request), and the
// time it is full again (now or later, at most one second per missing request away).
func (s *suite) checkRateLimit(ctx context.Context) error {
	var seen []hcloud.Ratelimit
	opts := hcloud.FloatingIPListOpts{ListOpts: hcloud.ListOpts{PerPage: 1, LabelSelector: runLabel + "=" + s.run}}
	for range 5 {
		_, resp, err := s.client.FloatingIP.List(ctx, opts)
		if err != nil {
			return fmt.Errorf("FloatingIP.List: %w", err)
		}
		seen = append(seen, resp.Meta.Ratelimit)
	}
	now := time.Now()
	for _, r := range seen {
		switch {
		case r.Limit != s.cfg.rateLimit:
			return fmt.Errorf("RateLimit-Limit %d, want %d (all: %v)", r.Limit, s.cfg.rateLimit, seen)
		case r.Remaining < 0 || r.Remaining > r.Limit:
			return fmt.Errorf("RateLimit-Remaining %d outside 0..%d (all: %v)", r.Remaining, r.Limit, seen)
		case r.Reset.IsZero():
			return fmt.Errorf("no RateLimit-Reset (all: %v)", seen)
		case r.Reset.Before(now.Add(-5 * time.Second)):
			return fmt.Errorf("RateLimit-Reset %s is in the past (now %s)", r.Reset.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
		case r.Reset.After(now.Add(time.Duration(r.Limit-r.Remaining+2) * time.Second)):
			return fmt.Errorf("RateLimit-Reset %s is further than one second per used request (%d) away", r.Reset.UTC().Format(time.RFC3339), r.Limit-r.Remaining)
		}
	}
	if first, last := seen[0], seen[len(seen)-1]; last.Remaining >= first.Remaining {
		return fmt.Errorf("RateLimit-Remaining did not fall over %d quick requests: %d then %d", len(seen), first.Remaining, last.Remaining)
	}
	return nil
}

// cleanup deletes every Floating IP the run created (a delete unassigns first); the run's own
// selector then lists none.
func (s *suite) cleanup(ctx context.Context) error {
	var problems []string
	for _, id := range s.created {
		if err := s.deleteFIP(ctx, id); err != nil {
			problems = append(problems, err.Error())
		}
	}
	left, err := s.client.FloatingIP.AllWithOpts(ctx, hcloud.FloatingIPListOpts{ListOpts: hcloud.ListOpts{LabelSelector: runLabel + "=" + s.run}})
	if err != nil {
		problems = append(problems, fmt.Sprintf("FloatingIP.AllWithOpts(%s=%s): %v", runLabel, s.run, err))
	}
	for _, f := range left {
		problems = append(problems, fmt.Sprintf("Floating IP %d (%s) still listed", f.ID, f.Name))
		_ = s.deleteFIP(ctx, f.ID)
	}
	if len(problems) > 0 {
		return fmt.Errorf("%d Floating IPs created; %s", len(s.created), strings.Join(problems, "; "))
	}
	if s.probe != nil {
		if got, _, err := s.client.FloatingIP.GetByID(ctx, s.probe.ID); err != nil || got != nil {
			return fmt.Errorf("FloatingIP.GetByID(%d) after its delete: (%v, %v), want (nil, nil)", s.probe.ID, fipID(got), err)
		}
	}
	return nil
}

// deleteFIP deletes one Floating IP, waiting out a lock (an action still running) for a while;
// already gone is fine.
func (s *suite) deleteFIP(ctx context.Context, id int64) error {
	for {
		_, err := s.client.FloatingIP.Delete(ctx, &hcloud.FloatingIP{ID: id})
		switch {
		case err == nil, hcloud.IsError(err, hcloud.ErrorCodeNotFound):
			return nil
		case hcloud.IsError(err, hcloud.ErrorCodeLocked) && ctx.Err() == nil:
			time.Sleep(100 * time.Millisecond)
		default:
			return fmt.Errorf("FloatingIP.Delete(%d): %w", id, err)
		}
	}
}

// actionShows checks an action as an action endpoint answered it: running (so the waiter has
// to poll it), with its command, start and resources.
func actionShows(a *hcloud.Action, command string, fipID int64) error {
	switch {
	case a == nil || a.ID == 0:
		return errors.New("no action.id in the answer")
	case a.Command != command:
		return fmt.Errorf("action %d: command %q, want %q", a.ID, a.Command, command)
	case a.Status != hcloud.ActionStatusRunning:
		return fmt.Errorf("action %d: status %q, want running (the API's action time must be above zero, or the waiter is not tried)", a.ID, a.Status)
	case a.Started.IsZero():
		return fmt.Errorf("action %d: no started time", a.ID)
	case !a.Finished.IsZero():
		return fmt.Errorf("action %d: running with a finished time", a.ID)
	case a.Progress >= 100:
		return fmt.Errorf("action %d: running at progress %d", a.ID, a.Progress)
	case !slices.ContainsFunc(a.Resources, func(r *hcloud.ActionResource) bool {
		return r.Type == hcloud.ActionResourceTypeFloatingIP && r.ID == fipID
	}):
		return fmt.Errorf("action %d: resources %v lack floating_ip %d", a.ID, resources(a), fipID)
	}
	return nil
}

// actionSucceeded reads an action back once the waiter returned: success, 100 %, finished.
func (s *suite) actionSucceeded(ctx context.Context, id int64) error {
	a, _, err := s.client.Action.GetByID(ctx, id)
	if err != nil || a == nil {
		return fmt.Errorf("Action.GetByID(%d): (%v, %v)", id, a, err)
	}
	if a.Status != hcloud.ActionStatusSuccess || a.Progress != 100 || a.Finished.IsZero() || a.Finished.Before(a.Started) {
		return fmt.Errorf("action %d after the waiter: status %q progress %d started %s finished %s, want success, 100, finished after started",
			id, a.Status, a.Progress, a.Started.Format(time.RFC3339Nano), a.Finished.Format(time.RFC3339Nano))
	}
	return nil
}

func resources(a *hcloud.Action) []string {
	var out []string
	for _, r := range a.Resources {
		out = append(out, fmt.Sprintf("%s %d", r.Type, r.ID))
	}
	return out
}

func fipIDs(l []*hcloud.FloatingIP) []int64 {
	out := make([]int64, 0, len(l))
	for _, f := range l {
		out = append(out, f.ID)
	}
	return out
}

func serverID(srv *hcloud.Server) string {
	if srv == nil {
		return "null"
	}
	return fmt.Sprint(srv.ID)
}

func serverIDOf(fip *hcloud.FloatingIP) string {
	if fip == nil {
		return "<no Floating IP>"
	}
	return serverID(fip.Server)
}

func status(resp *hcloud.Response) string {
	if resp == nil || resp.Response == nil {
		return "no answer"
	}
	return resp.Status
}

func errOrNil(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}
