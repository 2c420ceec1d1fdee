package ferrymysql

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
)

// gtidPos is a MariaDB GTID position: the last transaction of each
// replication domain (gtid_binlog_pos's and @slave_connect_state's form).
// It is immutable: with returns a new one, and text is formatted once.
type gtidPos struct {
	last []gomysql.MariadbGTID // one per domain, by domain
	s    string
}

func parseGTIDPos(s string) (gtidPos, error) {
	var p gtidPos
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		f := strings.Split(part, "-")
		if len(f) != 3 {
			return gtidPos{}, fmt.Errorf("GTID %q is not domain-server-sequence", part)
		}
		domain, err1 := strconv.ParseUint(f[0], 10, 32)
		server, err2 := strconv.ParseUint(f[1], 10, 32)
		seq, err3 := strconv.ParseUint(f[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return gtidPos{}, fmt.Errorf("GTID %q is not domain-server-sequence", part)
		}
		g := gomysql.MariadbGTID{DomainID: uint32(domain), ServerID: uint32(server), SequenceNumber: seq}
		if slices.ContainsFunc(p.last, func(o gomysql.MariadbGTID) bool { return o.DomainID == g.DomainID }) {
			return gtidPos{}, fmt.Errorf("domain %d appears twice", domain)
		}
		p.last = append(p.last, g)
	}
	return p.sorted(), nil
}

func (p gtidPos) sorted() gtidPos {
	slices.SortFunc(p.last, func(a, b gomysql.MariadbGTID) int { return int(a.DomainID) - int(b.DomainID) })
	parts := make([]string, len(p.last))
	for i := range p.last {
		parts[i] = p.last[i].String()
	}
	p.s = strings.Join(parts, ",")
	return p
}

// with is p after transaction g.
func (p *gtidPos) with(g gomysql.MariadbGTID) *gtidPos {
	if p == nil {
		return nil // not known before g: not known after it either
	}
	n := gtidPos{last: slices.Clone(p.last)}
	i := slices.IndexFunc(n.last, func(o gomysql.MariadbGTID) bool { return o.DomainID == g.DomainID })
	if i >= 0 {
		n.last[i] = g
	} else {
		n.last = append(n.last, g)
	}
	n = n.sorted()
	return &n
}

// text is p's form for a cursor; nil when p is not known.
func (p *gtidPos) text() *string {
	if p == nil {
		return nil
	}
	return &p.s
}

func (p *gtidPos) String() string {
	if p == nil {
		return "unknown"
	}
	return p.s
}
