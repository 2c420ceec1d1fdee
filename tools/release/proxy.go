package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// A file module proxy: GOPROXY=file://DIR serves DIR/<module>/@v/list,
// <version>.info, <version>.mod and <version>.zip, as a module proxy
// does over HTTP.

// source is where a module's files come from: the working tree, or a
// git revision of the repository at root.
type source struct {
	root string
	rev  string // "": the working tree
}

// addToProxy writes module m of the workspace at version v, from src,
// into the proxy at dir.
func addToProxy(dir string, m *mod, v string, src source) error {
	esc, err := module.EscapePath(m.path)
	if err != nil {
		return err
	}
	at := filepath.Join(dir, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		return err
	}
	mv := module.Version{Path: m.path, Version: v}
	var zbuf bytes.Buffer
	var goMod []byte
	when := time.Now().UTC()
	if src.rev == "" {
		err = zip.CreateFromDir(&zbuf, mv, filepath.Join(src.root, m.dir))
		if err == nil {
			goMod, err = os.ReadFile(filepath.Join(src.root, m.dir, "go.mod"))
		}
	} else {
		subdir := ""
		if m.dir != "." {
			subdir = m.dir + "/"
		}
		err = zip.CreateFromVCS(&zbuf, mv, src.root, src.rev, subdir)
		if err == nil {
			var out string
			out, err = run(src.root, nil, "git", "show", src.rev+":"+strings.TrimPrefix(subdir+"go.mod", "./"))
			goMod = []byte(out)
		}
		if err == nil {
			var out string
			if out, err = run(src.root, nil, "git", "log", "-1", "--format=%cI", src.rev); err == nil {
				when, err = time.Parse(time.RFC3339, strings.TrimSpace(out))
			}
		}
	}
	if err != nil {
		return fmt.Errorf("module %s %s: %w", m.path, v, err)
	}
	info, _ := json.Marshal(map[string]any{"Version": v, "Time": when.UTC().Format(time.RFC3339)})
	for name, data := range map[string][]byte{v + ".zip": zbuf.Bytes(), v + ".mod": goMod, v + ".info": info} {
		if err := os.WriteFile(filepath.Join(at, name), data, 0o644); err != nil {
			return err
		}
	}
	list := filepath.Join(at, "list")
	old, _ := os.ReadFile(list)
	versions := strings.Fields(string(old))
	if !slices.Contains(versions, v) {
		versions = append(versions, v)
	}
	return os.WriteFile(list, []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}

// forgetCached removes the workspace's modules from the module cache: a
// proxy of this tree may serve other bytes under a version than the last
// one did, and the go command would use what it cached.
func forgetCached() error {
	out, err := run(".", nil, "go", "env", "GOMODCACHE")
	if err != nil {
		return err
	}
	cache := strings.TrimSpace(out)
	for _, d := range []string{filepath.Join(cache, "github.com", "ferry-dev"), filepath.Join(cache, "cache", "download", "github.com", "ferry-dev")} {
		// The module cache's directories are read-only.
		_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				_ = os.Chmod(p, 0o755)
			}
			return nil
		})
		if err := os.RemoveAll(d); err != nil {
			return err
		}
	}
	return nil
}

// proxyEnv is the environment of a go command that resolves the
// workspace's modules from the proxy at dir (and the rest from the usual
// proxies), with no go.work, and their checksums kept out of the checksum
// database. The usual proxies end in "|off", not "direct": a proxy that
// answers 403 for a module path it does not have (as this project's
// machines' does), where the go command expects 404, would otherwise end a
// lookup that go get -u makes of every package path's parents.
func proxyEnv(dir string) []string {
	upstream, _ := run(".", nil, "go", "env", "GOPROXY")
	var proxies []string
	for p := range strings.FieldsFuncSeq(strings.TrimSpace(upstream), func(r rune) bool { return r == ',' || r == '|' }) {
		if p != "direct" && p != "off" {
			proxies = append(proxies, p)
		}
	}
	if len(proxies) == 0 {
		proxies = []string{"https://proxy.golang.org"}
	}
	return []string{"GOWORK=off", "GOPROXY=file://" + filepath.ToSlash(dir) + "," + strings.Join(proxies, ",") + "|off",
		"GONOSUMDB=github.com/ferry-dev", "GOFLAGS=-mod=mod"}
}
