package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"golang.org/x/mod/semver"
)

// release cuts version v: every sibling require and go.work name v, every
// module is tidied and checked and builds, the CHANGELOG has v's section,
// then one commit and a tag for every released module path. With dryRun,
// all of it happens in a scratch clone of HEAD and this repository is
// left as it was.
func release(ws *workspace, v string, dryRun bool) error {
	if !semver.IsValid(v) || semver.Canonical(v) != v {
		return fmt.Errorf("version %q is not a canonical semantic version (v0.1.0)", v)
	}
	if dryRun {
		scratch, err := os.MkdirTemp("", "ferry-release-dry-run-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(scratch)
		clone, err := cloneHead(ws.root, scratch)
		if err != nil {
			return err
		}
		cws, err := loadWorkspace(clone)
		if err != nil {
			return err
		}
		tags, err := cut(cws, v, true)
		if err != nil {
			return err
		}
		fmt.Printf("dry run: %s would be released as %d tags: %s\n", v, len(tags), strings.Join(tags, " "))
		return nil
	}
	if out, err := run(ws.root, nil, "git", "status", "--porcelain"); err != nil || strings.TrimSpace(out) != "" {
		return fmt.Errorf("the working tree has changes: commit or stash them first\n%s", out)
	}
	tags, err := cut(ws, v, true)
	if err != nil {
		return err
	}
	fmt.Printf("released %s: %d tags (%s); push them with: git push origin %s\n", v, len(tags), strings.Join(tags, " "), strings.Join(tags, " "))
	return nil
}

// cut releases v in the repository of ws, which it changes: it returns the
// tags it made. With build, every module is built before the commit (prove
// builds what it takes from the proxy instead).
func cut(ws *workspace, v string, build bool) ([]string, error) {
	for _, m := range ws.modules {
		if m.released {
			if out, _ := run(ws.root, nil, "git", "tag", "--list", m.tag(v)); strings.TrimSpace(out) != "" {
				return nil, fmt.Errorf("tag %s exists already: a released version is never released again (release the next version)", m.tag(v))
			}
		}
	}
	if err := changelogHas(ws.root, v); err != nil {
		return nil, err
	}
	if err := ws.setVersion(v); err != nil {
		return nil, err
	}
	if err := stampCommit(ws.root); err != nil {
		return nil, err
	}
	if err := ws.tidy(); err != nil {
		return nil, err
	}
	problems, err := ws.check()
	if err != nil {
		return nil, err
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%s cannot be released:\n  %s", v, joinLines(problems))
	}
	for _, m := range ws.modules {
		if !build {
			break
		}
		fmt.Fprintf(os.Stderr, "build %s\n", m.dir)
		// In the workspace (this tool runs with GOWORK=off); a command is
		// built and thrown away, not written into the tree.
		if _, err := run(filepath.Join(ws.root, m.dir), []string{"GOWORK=" + filepath.Join(ws.root, "go.work")}, "go", "build", "-o", os.DevNull, "./..."); err != nil {
			return nil, err
		}
	}
	if out, _ := run(ws.root, nil, "git", "status", "--porcelain"); strings.TrimSpace(out) != "" {
		if _, err := run(ws.root, nil, "git", "commit", "-q", "-am", "Release "+v); err != nil {
			return nil, err
		}
	}
	var tags []string
	for _, m := range ws.modules {
		if !m.released {
			continue
		}
		if _, err := run(ws.root, nil, "git", "tag", "-a", m.tag(v), "-m", "Ferry "+v+": "+m.path); err != nil {
			return nil, err
		}
		tags = append(tags, m.tag(v))
	}
	return tags, nil
}

// stampFile holds the commit a release was cut from (cmd/ferry's `ferry
// version` names it in a binary installed with go install).
const stampFile = "cmd/ferry/release.go"

// stampCommit writes HEAD's commit into stampFile.
func stampCommit(root string) error {
	head, err := run(root, nil, "git", "rev-parse", "HEAD")
	if err != nil {
		return err
	}
	p := filepath.Join(root, stampFile)
	data, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	re := regexp.MustCompile(`(?m)^const releaseCommit = ".*"$`)
	if !re.Match(data) {
		return fmt.Errorf("%s has no line const releaseCommit = \"…\" to write the commit into", stampFile)
	}
	return os.WriteFile(p, re.ReplaceAll(data, []byte(`const releaseCommit = "`+strings.TrimSpace(head)+`"`)), 0o644)
}

// changelogHas checks that CHANGELOG.md has a section for v.
func changelogHas(root, v string) error {
	data, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		return err
	}
	re := regexp.MustCompile(`(?m)^## \[` + regexp.QuoteMeta(strings.TrimPrefix(v, "v")) + `\] - \d{4}-\d{2}-\d{2}`)
	if !re.Match(data) {
		return fmt.Errorf("CHANGELOG.md has no section \"## [%s] - YYYY-MM-DD\": move the Unreleased entries under it first", strings.TrimPrefix(v, "v"))
	}
	return nil
}

// cloneHead clones the repository at root into dir and returns the
// clone's path.
func cloneHead(root, dir string) (string, error) {
	clone := filepath.Join(dir, "ferry")
	if _, err := run(dir, nil, "git", "clone", "-q", "--no-hardlinks", root, clone); err != nil {
		return "", err
	}
	for _, kv := range [][2]string{{"user.name", "Ferry release check"}, {"user.email", "release-check@ferry.invalid"}} {
		if _, err := run(clone, nil, "git", "config", kv[0], kv[1]); err != nil {
			return "", err
		}
	}
	return clone, nil
}
