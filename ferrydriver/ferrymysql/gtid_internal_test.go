package ferrymysql

import (
	"testing"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
)

func TestGTIDPos(t *testing.T) {
	for in, want := range map[string]string{"": "", "0-1-5": "0-1-5", "1-2-3, 0-1-5": "0-1-5,1-2-3"} {
		p, err := parseGTIDPos(in)
		if err != nil || p.s != want {
			t.Errorf("parseGTIDPos(%q) = %q, %v; want %q", in, p.s, err, want)
		}
	}
	for _, in := range []string{"0-1", "a-b-c", "0-1-5,0-2-6", "0-1-5-7", "-1-1-1"} {
		if _, err := parseGTIDPos(in); err == nil {
			t.Errorf("parseGTIDPos(%q) gave no error", in)
		}
	}
	p, _ := parseGTIDPos("0-1-5,2-1-9")
	q := p.with(gomysql.MariadbGTID{DomainID: 0, ServerID: 2, SequenceNumber: 6})
	r := q.with(gomysql.MariadbGTID{DomainID: 1, ServerID: 3, SequenceNumber: 1})
	if p.s != "0-1-5,2-1-9" || q.s != "0-2-6,2-1-9" || *r.text() != "0-2-6,1-3-1,2-1-9" {
		t.Errorf("with: %q, %q, %q", p.s, q.s, r.s)
	}
	var unknown *gtidPos
	if unknown.with(gomysql.MariadbGTID{SequenceNumber: 1}) != nil || unknown.text() != nil || unknown.String() != "unknown" {
		t.Error("an unknown position stays unknown")
	}
}
