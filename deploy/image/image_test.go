package main

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/stretchr/testify/require"
)

const (
	testVersion = "v0.0.0-imagetest"
	testCommit  = "0123456789abcdef0123456789abcdef01234567"
)

// buildStatic builds cmd/ferry as make image does: static, for Linux,
// with the version and commit stamped.
func buildStatic(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ferry")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version="+testVersion+" -X main.commit="+testCommit, "-o", bin, ".")
	cmd.Dir = filepath.Join("..", "..", "cmd", "ferry")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

// TestImage builds the image into an OCI layout, reads it back, checks its
// config (user, entrypoint, labels, platform) and files, then runs the
// binary it holds, unpacked from the layer: `ferry version` names the
// version and commit, and `ferry demo --events 2000` passes. With podman
// (Debian's, rootful or rootless) the same image runs as a container too;
// where podman is missing (it must be there under CI=true) or cannot
// run containers (a container inside a container), the test says so.
func TestImage(t *testing.T) {
	bin := buildStatic(t)
	o := &options{binary: bin, caCerts: "/etc/ssl/certs/ca-certificates.crt", version: testVersion, commit: testCommit,
		arch: runtime.GOARCH, source: "https://github.com/ferry-dev/ferry", created: time.Unix(1700000000, 0).UTC()}
	img, err := build(o)
	require.NoError(t, err)
	// Lowercase: podman names the image after the path.
	scratch, err := os.MkdirTemp("", "ferry-image-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(scratch) })
	dir := filepath.Join(scratch, "ferry-image")
	require.NoError(t, writeLayout(dir, img, testVersion))

	// Read back through the layout, as a registry tool would.
	p, err := layout.FromPath(dir)
	require.NoError(t, err)
	idx, err := p.ImageIndex()
	require.NoError(t, err)
	im, err := idx.IndexManifest()
	require.NoError(t, err)
	require.Len(t, im.Manifests, 1)
	require.Equal(t, testVersion, im.Manifests[0].Annotations[refName])
	require.Equal(t, "application/vnd.oci.image.manifest.v1+json", string(im.Manifests[0].MediaType))
	back, err := idx.Image(im.Manifests[0].Digest)
	require.NoError(t, err)
	cf, err := back.ConfigFile()
	require.NoError(t, err)
	require.Equal(t, "linux", cf.OS)
	require.Equal(t, runtime.GOARCH, cf.Architecture)
	require.Equal(t, "65532:65532", cf.Config.User, "a non-root user")
	require.Equal(t, []string{"/usr/local/bin/ferry"}, cf.Config.Entrypoint)
	require.Equal(t, []string{"run"}, cf.Config.Cmd)
	require.Equal(t, "/home/ferry", cf.Config.WorkingDir)
	require.Equal(t, testVersion, cf.Config.Labels["org.opencontainers.image.version"])
	require.Equal(t, testCommit, cf.Config.Labels["org.opencontainers.image.revision"])
	require.Equal(t, "https://github.com/ferry-dev/ferry", cf.Config.Labels["org.opencontainers.image.source"])
	require.Contains(t, cf.Config.Env, "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt")
	layers, err := back.Layers()
	require.NoError(t, err)
	require.Len(t, layers, 1, "from scratch: one layer, no base image")

	// Same inputs, same image.
	again, err := build(o)
	require.NoError(t, err)
	d1, err := back.Digest()
	require.NoError(t, err)
	d2, err := again.Digest()
	require.NoError(t, err)
	require.Equal(t, d1, d2, "the build is reproducible")

	// Unpack the filesystem (what a runtime would mount) and check it.
	root := t.TempDir()
	files := unpack(t, mutate.Extract(back), root)
	require.Contains(t, files, "usr/local/bin/ferry")
	require.Contains(t, files, "home/ferry")
	require.Equal(t, int64(0o755), files["usr/local/bin/ferry"].Mode&0o777)
	require.Equal(t, 65532, files["home/ferry"].Uid, "the user owns its home")
	passwd, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	require.NoError(t, err)
	require.Contains(t, string(passwd), "ferry:x:65532:65532:")
	ca, err := os.ReadFile(filepath.Join(root, "etc/ssl/certs/ca-certificates.crt"))
	require.NoError(t, err)
	require.Contains(t, string(ca), "BEGIN CERTIFICATE")

	ferry := filepath.Join(root, "usr/local/bin/ferry")
	out, err := exec.Command(ferry, "version").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), testVersion)
	require.Contains(t, string(out), testCommit)
	demo := exec.Command(ferry, "demo", "--events", "2000")
	demo.Dir = t.TempDir()
	out, err = demo.CombinedOutput()
	require.NoError(t, err, "ferry demo from the image's layer:\n%s", out)
	t.Logf("ferry demo --events 2000 from the unpacked layer:\n%s", lastLines(string(out), 8))

	podmanRun(t, dir)
}

// podmanRun runs the image with podman: version, then the demo.
func podmanRun(t *testing.T, dir string) {
	podman, err := exec.LookPath("podman")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("podman is not installed: .ci/services installs it (apt-get install podman)")
		}
		t.Log("podman is not installed (apt-get install podman): the image was checked from its unpacked layer only")
		return
	}
	ref := "oci:" + dir + ":" + testVersion
	// podman stores what it ran as localhost/<dir>.
	defer func() { _ = exec.Command(podman, "rmi", "--force", "localhost"+dir).Run() }()
	out, err := exec.Command(podman, "run", "--rm", "--network", "none", ref, "version").CombinedOutput()
	if err != nil {
		// A container runtime needs namespaces and cgroups this machine
		// may not grant (a container inside a container).
		t.Logf("podman cannot run containers here (%v); the image was checked from its unpacked layer only:\n%s", err, lastLines(string(out), 10))
		return
	}
	require.Contains(t, string(out), testVersion)
	out, err = exec.Command(podman, "run", "--rm", "--network", "none", ref, "demo", "--events", "2000").CombinedOutput()
	require.NoError(t, err, "ferry demo in podman:\n%s", out)
	t.Logf("ferry demo --events 2000 in podman:\n%s", lastLines(string(out), 8))
}

// unpack writes the tar stream r under root and returns its headers by
// name.
func unpack(t *testing.T, r io.ReadCloser, root string) map[string]*tar.Header {
	t.Helper()
	defer r.Close()
	out := map[string]*tar.Header{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		out[strings.TrimSuffix(h.Name, "/")] = h
		p := filepath.Join(root, filepath.FromSlash(strings.TrimSuffix(h.Name, "/")))
		switch h.Typeflag {
		case tar.TypeDir:
			require.NoError(t, os.MkdirAll(p, 0o755))
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode&0o777))
			require.NoError(t, err)
			_, err = io.Copy(f, tr)
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
