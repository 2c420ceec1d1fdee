package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// docVersion matches one of the workspace's modules named at a version in
// the docs (`go get github.com/ferry-dev/ferry/ferrydriver/ferrypg@v0.1.0`,
// go install lines): the root module's path, then any subpath.
func (ws *workspace) docVersion() *regexp.Regexp {
	root := ""
	for _, m := range ws.modules {
		if m.dir == "." {
			root = m.path
		}
	}
	return regexp.MustCompile(`(` + regexp.QuoteMeta(root) + `[A-Za-z0-9_./-]*)@(v[0-9]+\.[0-9]+\.[0-9]+)`)
}

// docPages lists README.md and every Markdown page under docs/.
func docPages(root string) ([]string, error) {
	var pages []string
	if _, err := os.Stat(filepath.Join(root, "README.md")); err == nil {
		pages = append(pages, filepath.Join(root, "README.md"))
	}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			pages = append(pages, p)
		}
		return nil
	})
	if os.IsNotExist(err) {
		err = nil
	}
	return pages, err
}

// setDocVersion makes every Ferry module the docs name at a version name v,
// so that their go get and go install lines take the release.
func (ws *workspace) setDocVersion(v string) error {
	docVersion := ws.docVersion()
	pages, err := docPages(ws.root)
	if err != nil {
		return err
	}
	for _, p := range pages {
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out := docVersion.ReplaceAll(data, []byte("${1}@"+v))
		if string(out) != string(data) {
			if err := os.WriteFile(p, out, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// docProblems lists the places where the docs name a Ferry module at
// another version than v, the one the tree's siblings require.
func (ws *workspace) docProblems(v string) ([]string, error) {
	docVersion := ws.docVersion()
	pages, err := docPages(ws.root)
	if err != nil {
		return nil, err
	}
	var problems []string
	for _, p := range pages {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		for i, line := range strings.Split(string(data), "\n") {
			for _, m := range docVersion.FindAllStringSubmatch(line, -1) {
				if m[2] != v {
					rel, _ := filepath.Rel(ws.root, p)
					problems = append(problems, fmt.Sprintf("%s:%d names %s@%s, where the tree's siblings are %s: run `make release/set VERSION=%s`", filepath.ToSlash(rel), i+1, m[1], m[2], v, v))
				}
			}
		}
	}
	return problems, nil
}
