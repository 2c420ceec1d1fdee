package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"
)

// Child processes: a contender's relay, run as a process of its own so
// that its CPU is measured apart and it can be killed.

// child is the relay process.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	pid    int
	done   chan struct{}
	err    error
	mu     sync.Mutex
	closed bool
}

func (r *runner) startChild(args []string) (*child, error) {
	full := append([]string{"relay", "--database-url", r.o.DatabaseURL, "--nats-url", r.o.NATSURL}, args...)
	cmd := r.o.RelayCommand(full)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = pw
	cmd.Stderr = r.relayLog
	if err := cmd.Start(); err != nil {
		_ = pr.Close()
		_ = pw.Close()
		return nil, fmt.Errorf("start relay child: %w", err)
	}
	_ = pw.Close()
	c := &child{cmd: cmd, stdin: stdin, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		if c.err == nil {
			c.err = errors.New("exited")
		}
		close(c.done)
	}()
	if err := waitReady(bufio.NewReader(pr), 2*time.Minute); err != nil {
		c.kill()
		_ = pr.Close()
		return nil, fmt.Errorf("%w (see relay.log)", err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr); _ = pr.Close() }()
	return c, nil
}

func (c *child) start() error {
	_, err := io.WriteString(c.stdin, "go\n")
	return err
}

// exitedEarly returns the child's exit error if it has exited.
func (c *child) exitedEarly() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

// stop closes the child's stdin (its signal to stop gracefully) and waits,
// killing it after 20 s.
func (c *child) stop() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.mu.Unlock()
	_ = c.stdin.Close()
	select {
	case <-c.done:
	case <-time.After(20 * time.Second):
		c.kill()
	}
}

func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
}
