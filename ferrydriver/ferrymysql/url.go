package ferrymysql

import (
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// DSNFromURL turns a mysql:// URL (mysql://user:password@host:3306/db,
// with go-sql-driver/mysql parameters in its query, ?tls=true for one)
// into the driver's DSN (user:password@tcp(host:3306)/db).
func DSNFromURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("ferrymysql: %q is not a URL: %w", raw, err)
	}
	if u.Scheme != "mysql" && u.Scheme != "mariadb" {
		return "", fmt.Errorf("ferrymysql: %q is not a mysql:// URL (mysql://user:password@host:3306/db)", raw)
	}
	c := mysql.NewConfig()
	c.Net = "tcp"
	c.Addr = u.Host
	if u.Port() == "" {
		c.Addr = net.JoinHostPort(u.Hostname(), "3306")
	}
	if u.User != nil {
		c.User = u.User.Username()
		c.Passwd, _ = u.User.Password()
	}
	c.DBName = strings.TrimPrefix(u.Path, "/")
	q := u.Query()
	params := map[string]string{}
	for k := range q {
		params[k] = q.Get(k)
	}
	dsn := c.FormatDSN()
	if len(params) > 0 {
		// FormatDSN does not take unknown parameters: append them as the
		// URL had them, for ParseDSN to read.
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + q.Encode()
	}
	if _, err := mysql.ParseDSN(dsn); err != nil {
		return "", fmt.Errorf("ferrymysql: %q: %w", raw, err)
	}
	return dsn, nil
}
