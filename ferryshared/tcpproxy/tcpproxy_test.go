package tcpproxy

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// echo serves lines back until the test ends.
func echo(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := c.Write(append(sc.Bytes(), '\n')); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, msg string) (string, error) {
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

func TestProxyForwardsResetsAndRefuses(t *testing.T) {
	p, err := Start(echo(t))
	require.NoError(t, err)
	defer p.Close()

	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	got, err := roundTrip(c, "hello")
	require.NoError(t, err)
	require.Equal(t, "hello\n", got)

	p.Reset()
	_, err = roundTrip(c, "again")
	require.Error(t, err, "a reset connection must fail")

	done := make(chan struct{})
	go func() { p.Outage(300 * time.Millisecond); close(done) }()
	time.Sleep(50 * time.Millisecond)
	d, err := net.Dial("tcp", p.Addr())
	if err == nil {
		_, err = roundTrip(d, "during")
	}
	require.Error(t, err, "connections are refused during an outage")
	<-done
	e, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	got, err = roundTrip(e, "after")
	require.NoError(t, err)
	require.Equal(t, "after\n", got)
}
