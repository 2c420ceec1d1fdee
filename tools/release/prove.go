package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/semver"
)

// prove shows that a user outside this repository can take the release
// the tree names: from a scratch clone of HEAD (tagged there, as tags may
// not travel with the tree), a file module proxy of the tagged modules,
// and then, in empty directories, with no go.work and that proxy first:
//
//   - go install of the command at the version, whose `ferry version`
//     names the version and a commit, and whose demo runs;
//   - each program of programs/, copied alone into a module of its own
//     that takes Ferry's modules with go get at the version, builds and
//     passes its tests (among them, the packages it compiles);
//   - a next patch version cut in the scratch clone, taken by
//     `go get -u=patch ./...` in each program (every dependency moves to its
//     latest patch release, as a user taking a patch release does; plain -u
//     would also take every dependency's newest minor version, which is the
//     user's choice, not Ferry's release).
//
// A module that requires an untagged version of a sibling, or imports
// another module's internal/ package, fails it.
func prove(ws *workspace, keep bool) error {
	scratch, err := os.MkdirTemp("", "ferry-release-prove-")
	if err != nil {
		return err
	}
	if keep {
		fmt.Printf("scratch directory: %s\n", scratch)
	} else {
		defer os.RemoveAll(scratch)
	}
	clone, err := cloneHead(ws.root, scratch)
	if err != nil {
		return err
	}
	cws, err := loadWorkspace(clone)
	if err != nil {
		return err
	}
	problems, err := cws.check()
	if err != nil {
		return err
	}
	if len(problems) > 0 {
		return fmt.Errorf("the tree cannot be released:\n  %s", joinLines(problems))
	}
	v, err := cws.version()
	if err != nil {
		return err
	}
	// The release the tree names, as its tags have it; where they did not
	// travel with the tree, as the tree would release it now.
	if out, _ := run(clone, nil, "git", "tag", "--list", v); strings.TrimSpace(out) == "" {
		step("no tag " + v + " here: it is cut from the tree, in the scratch clone")
		if _, err := cut(cws, v, false); err != nil {
			return err
		}
	}
	proxy := filepath.Join(scratch, "proxy")
	if err := publish(cws, proxy, v); err != nil {
		return err
	}
	url, stop, err := serveProxy(proxy)
	if err != nil {
		return err
	}
	defer stop()
	env := append(proxyEnv(url), "GOFLAGS=")
	step("the command: go install github.com/ferry-dev/ferry/cmd/ferry@" + v)
	ferry, err := installCommand(scratch, env, v)
	if err != nil {
		return err
	}
	programs, err := copyPrograms(clone, scratch)
	if err != nil {
		return err
	}
	for _, p := range programs {
		step("program " + p.name + ": go get " + strings.Join(p.modules, " ") + " at " + v)
		if err := p.take(env, v, ""); err != nil {
			return err
		}
	}
	next := nextPatch(v)
	step("an upgrade: " + next + " cut in the scratch clone, taken with go get -u=patch")
	if err := bumpChangelog(clone, next); err != nil {
		return err
	}
	if _, err := run(clone, nil, "git", "commit", "-q", "-am", "CHANGELOG: "+next); err != nil {
		return err
	}
	if _, err := cut(cws, next, false); err != nil {
		return err
	}
	if err := publish(cws, proxy, next); err != nil {
		return err
	}
	for _, p := range programs {
		if err := p.take(env, next, "-u=patch"); err != nil {
			return err
		}
	}
	fmt.Printf("\nrelease %s proved: sizes of the binaries built from the proxy: ferry %s", v, size(ferry))
	for _, p := range programs {
		fmt.Printf(", %s %s", p.name, size(p.binary))
	}
	fmt.Println()
	return nil
}

func step(s string) { fmt.Printf("== %s\n", s) }

// publish puts every released module of ws at its tag for v into the proxy.
func publish(ws *workspace, proxy, v string) error {
	if err := forgetCached(); err != nil {
		return err
	}
	for _, m := range ws.modules {
		if m.released {
			if err := addToProxy(proxy, m, v, source{root: ws.root, rev: m.tag(v)}); err != nil {
				return err
			}
		}
	}
	return nil
}

// installCommand installs the ferry command at v from the proxy, checks
// what `ferry version` says and runs its demo; it returns the binary.
func installCommand(scratch string, env []string, v string) (string, error) {
	bin := filepath.Join(scratch, "bin")
	empty := filepath.Join(scratch, "install")
	if err := os.MkdirAll(empty, 0o755); err != nil {
		return "", err
	}
	if _, err := run(empty, append(env, "GOBIN="+bin), "go", "install", "github.com/ferry-dev/ferry/cmd/ferry@"+v); err != nil {
		return "", err
	}
	ferry := filepath.Join(bin, "ferry")
	out, err := run(empty, nil, ferry, "version")
	if err != nil {
		return "", err
	}
	fmt.Print(out)
	if !strings.Contains(out, " "+v) || !regexp.MustCompile(`commit [0-9a-f]{12}`).MatchString(out) {
		return "", fmt.Errorf("`ferry version` of the installed command names no %s or no commit:\n%s", v, out)
	}
	if out, err = run(empty, nil, ferry, "demo", "--events", "2000"); err != nil {
		return "", err
	}
	fmt.Println(lastLine(out))
	return ferry, nil
}

// program is a copy of a program of programs/ in a module of its own.
type program struct {
	name, dir, binary string
	modules           []string // the Ferry modules it requires
}

func copyPrograms(clone, scratch string) ([]*program, error) {
	entries, err := os.ReadDir(filepath.Join(clone, "programs"))
	if err != nil {
		return nil, err
	}
	ws := &workspace{root: clone}
	var out []*program
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		src := filepath.Join(clone, "programs", e.Name())
		f, err := ws.modFile(filepath.Join("programs", e.Name()))
		if err != nil {
			return nil, err
		}
		p := &program{name: e.Name(), dir: filepath.Join(scratch, "programs", e.Name())}
		for _, r := range f.Require {
			if strings.HasPrefix(r.Mod.Path, "github.com/ferry-dev/ferry") && !r.Indirect {
				p.modules = append(p.modules, r.Mod.Path)
			}
		}
		if err := os.MkdirAll(p.dir, 0o755); err != nil {
			return nil, err
		}
		files, err := os.ReadDir(src)
		if err != nil {
			return nil, err
		}
		for _, fe := range files {
			if fe.IsDir() || !strings.HasSuffix(fe.Name(), ".go") {
				continue
			}
			data, err := os.ReadFile(filepath.Join(src, fe.Name()))
			if err != nil {
				return nil, err
			}
			if err := os.WriteFile(filepath.Join(p.dir, fe.Name()), data, 0o644); err != nil {
				return nil, err
			}
		}
		if _, err := run(p.dir, []string{"GOWORK=off"}, "go", "mod", "init", "example.com/"+p.name); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("programs/ holds no program")
	}
	return out, nil
}

// take makes the program use its Ferry modules at v (go get, with flag:
// -u=patch for an upgrade), checks that it does, builds it and runs its
// tests.
func (p *program) take(env []string, v, flag string) error {
	args := []string{"get"}
	if flag != "" {
		args = append(args, flag, "./...") // what the program imports, and what that needs
	} else {
		for _, m := range p.modules {
			args = append(args, m+"@"+v)
		}
	}
	if _, err := run(p.dir, env, "go", args...); err != nil {
		return err
	}
	if _, err := run(p.dir, env, "go", "mod", "tidy"); err != nil {
		return err
	}
	out, err := run(p.dir, env, "go", "list", "-m", "-f", "{{.Path}} {{.Version}}", "all")
	if err != nil {
		return err
	}
	for line := range strings.Lines(out) {
		path, version, _ := strings.Cut(strings.TrimSpace(line), " ")
		if strings.HasPrefix(path, "github.com/ferry-dev/ferry") && version != v {
			return fmt.Errorf("program %s uses %s %s after go get%s, not %s", p.name, path, version, flag, v)
		}
	}
	p.binary = filepath.Join(p.dir, p.name)
	if _, err := run(p.dir, env, "go", "build", "-o", p.binary, "."); err != nil {
		return err
	}
	out, err = run(p.dir, env, "go", "test", "-count=1", "./...")
	if err != nil {
		return err
	}
	fmt.Print(out)
	return nil
}

// nextPatch is v with its patch number one up.
func nextPatch(v string) string {
	var major, minor, patch int
	fmt.Sscanf(strings.TrimPrefix(semver.Canonical(v), "v"), "%d.%d.%d", &major, &minor, &patch)
	return fmt.Sprintf("v%d.%d.%d", major, minor, patch+1)
}

// bumpChangelog gives the CHANGELOG of the clone a section for next.
func bumpChangelog(clone, next string) error {
	p := filepath.Join(clone, "CHANGELOG.md")
	data, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	s := string(data)
	i := strings.Index(s, "\n## [")
	if i < 0 {
		return fmt.Errorf("CHANGELOG.md has no section")
	}
	section := fmt.Sprintf("\n## [%s] - %s\n\n### Fixed\n- The release check's own upgrade.\n", strings.TrimPrefix(next, "v"), time.Now().UTC().Format("2006-01-02"))
	return os.WriteFile(p, []byte(s[:i]+section+s[i:]), 0o644)
}

func size(path string) string {
	st, err := os.Stat(path)
	if err != nil {
		return "?"
	}
	return fmt.Sprintf("%.1f MiB", float64(st.Size())/(1<<20))
}

func lastLine(s string) string {
	lines := slices.DeleteFunc(strings.Split(strings.TrimSpace(s), "\n"), func(l string) bool { return strings.TrimSpace(l) == "" })
	if len(lines) == 0 {
		return ""
	}
	return lines[len(lines)-1]
}
