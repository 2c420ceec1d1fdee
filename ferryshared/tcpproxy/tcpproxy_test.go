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

// TestProxyHangsAndResumes: a hung proxy accepts and keeps connections but
// answers nothing; on Resume what was held arrives, and the connections
// work again.
func TestProxyHangsAndResumes(t *testing.T) {
	p, err := Start(echo(t))
	require.NoError(t, err)
	defer p.Close()

	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	got, err := roundTrip(c, "before")
	require.NoError(t, err)
	require.Equal(t, "before\n", got)

	p.Hang()
	r := bufio.NewReader(c)
	_ = c.SetDeadline(time.Now().Add(300 * time.Millisecond))
	_, err = c.Write([]byte("held\n"))
	require.NoError(t, err, "a hung proxy still takes writes")
	_, err = r.ReadString('\n')
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout(), "a hung proxy answers nothing: %v", err)

	d, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err, "a hung proxy accepts connections")
	_ = d.SetDeadline(time.Now().Add(300 * time.Millisecond))
	_, err = d.Write([]byte("new\n"))
	require.NoError(t, err)
	_, err = bufio.NewReader(d).ReadString('\n')
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout(), "nor on a new connection: %v", err)

	p.Resume()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	got, err = r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "held\n", got, "what was held arrives once resumed")
	_, err = c.Write([]byte("after\n"))
	require.NoError(t, err)
	got, err = r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "after\n", got)
}

// TestProxyClosesWhileHung: Close does not wait for a Resume.
func TestProxyClosesWhileHung(t *testing.T) {
	p, err := Start(echo(t))
	require.NoError(t, err)
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	_, err = roundTrip(c, "x")
	require.NoError(t, err)
	p.Hang()
	_, err = c.Write([]byte("held\n"))
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond) // let the proxy take it
	require.NoError(t, p.Close())
}
