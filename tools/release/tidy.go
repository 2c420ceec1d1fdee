package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// tidy runs go mod tidy in every module as a user's go command would see
// it: without go.work, the siblings fetched at the version the tree names
// from a proxy made of this tree. Each module's go.mod then lists what its
// siblings bring in. A sibling's go.mod feeds its dependents' tidy, so the
// rounds go on until no go.mod changes. The siblings' lines are dropped
// from each go.sum before each round and at the end: they hash this
// tree's bytes of the moment, not the tagged release's, and go.work
// builds the siblings from their directories.
func (ws *workspace) tidy() error {
	v, err := ws.version()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "ferry-tidy-proxy-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	url, stop, err := serveProxy(dir)
	if err != nil {
		return err
	}
	defer stop()
	for round := 1; ; round++ {
		if err := forgetCached(); err != nil {
			return err
		}
		for _, m := range ws.modules {
			if err := ws.dropSiblingSums(m.dir); err != nil {
				return err
			}
		}
		for _, m := range ws.modules {
			if m.released {
				if err := addToProxy(dir, m, v, source{root: ws.root}); err != nil {
					return err
				}
			}
		}
		changed := false
		for _, m := range ws.modules {
			before, err := os.ReadFile(filepath.Join(ws.root, m.dir, "go.mod"))
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "tidy %s (round %d)\n", m.dir, round)
			if _, err := run(filepath.Join(ws.root, m.dir), proxyEnv(url), "go", "mod", "tidy"); err != nil {
				return err
			}
			after, err := os.ReadFile(filepath.Join(ws.root, m.dir, "go.mod"))
			if err != nil {
				return err
			}
			changed = changed || !bytes.Equal(before, after)
		}
		if !changed {
			break
		}
		if round == 4 {
			return fmt.Errorf("go.mod files still change after %d rounds of tidy", round)
		}
	}
	for _, m := range ws.modules {
		if err := ws.dropSiblingSums(m.dir); err != nil {
			return err
		}
	}
	return forgetCached()
}

// dropSiblingSums removes the released modules' lines from dir's go.sum.
func (ws *workspace) dropSiblingSums(dir string) error {
	p := filepath.Join(ws.root, dir, "go.sum")
	data, err := os.ReadFile(p)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var keep []string
	for line := range strings.Lines(string(data)) {
		if path, _, ok := strings.Cut(line, " "); ok && ws.released(path) {
			continue
		}
		keep = append(keep, line)
	}
	return os.WriteFile(p, []byte(strings.Join(keep, "")), 0o644)
}

// proxy writes a file module proxy of the released modules of the tree, at
// the version it names, into dir.
func (ws *workspace) proxy(dir string) error {
	v, err := ws.version()
	if err != nil {
		return err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return err
	}
	for _, m := range ws.modules {
		if m.released {
			if err := addToProxy(dir, m, v, source{root: ws.root}); err != nil {
				return err
			}
		}
	}
	if err := forgetCached(); err != nil {
		return err
	}
	fmt.Printf("GOWORK=off GOPROXY=file://%s,$GOPROXY GONOSUMDB=github.com/ferry-dev GOFLAGS=-mod=mod\n", dir)
	return nil
}
