// Command image writes the OCI image of the ferry command, without a
// container daemon and without a base image: one layer assembled here
// holds the static binary (/usr/local/bin/ferry), the CA certificates of
// the build machine's bundle (Debian's /etc/ssl/certs/ca-certificates.crt),
// /etc/passwd and /etc/group with a non-root user ferry (65532), and its
// home /home/ferry, the working directory (ferry run's data directory
// lives there). The image runs as that user, its entrypoint is ferry, its
// labels name the version and the commit. `make image` runs it:
//
//	image --binary bin/ferry-linux-amd64 --version v0.1.0 --commit abc… --out bin/ferry-image
//
// writes an OCI image layout (a directory: oci-layout, index.json,
// blobs/) whose image is tagged with the version; `podman run
// oci:bin/ferry-image:v0.1.0 version` runs it, `skopeo copy` pushes it.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's user and paths.
const (
	uid        = 65532
	binaryPath = "/usr/local/bin/ferry"
	homeDir    = "/home/ferry"
	caPath     = "/etc/ssl/certs/ca-certificates.crt"
	// refName is the annotation of the image's tag in the layout's index.
	refName = "org.opencontainers.image.ref.name"
)

// options are what an image is built from.
type options struct {
	binary, caCerts string
	version, commit string
	arch            string
	created         time.Time
	source          string
}

func main() {
	var o options
	var out string
	var epoch int64
	flag.StringVar(&o.binary, "binary", "", "the ferry binary to ship: static (CGO_ENABLED=0), built for linux/<arch>")
	flag.StringVar(&o.caCerts, "ca-certs", "/etc/ssl/certs/ca-certificates.crt", "CA certificate bundle to ship (Debian: apt-get install ca-certificates)")
	flag.StringVar(&o.version, "version", "", "image version: label org.opencontainers.image.version and the tag")
	flag.StringVar(&o.commit, "commit", "", "commit the binary was built from: label org.opencontainers.image.revision")
	flag.StringVar(&o.arch, "arch", runtime.GOARCH, "the binary's architecture (GOARCH)")
	flag.StringVar(&o.source, "source", "https://github.com/ferry-dev/ferry", "label org.opencontainers.image.source")
	flag.Int64Var(&epoch, "source-date-epoch", envEpoch(), "creation time of the image and its files, in Unix seconds (SOURCE_DATE_EPOCH; default 0): the same inputs give the same image")
	flag.StringVar(&out, "out", "", "directory to write the OCI image layout to (replaced)")
	flag.Parse()
	o.created = time.Unix(epoch, 0).UTC()
	if out == "" || o.binary == "" || o.version == "" || o.commit == "" {
		fmt.Fprintln(os.Stderr, "image: --binary, --version, --commit and --out are required (make image sets them)")
		os.Exit(2)
	}
	img, err := build(&o)
	if err == nil {
		err = writeLayout(out, img, o.version)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	d, _ := img.Digest()
	fmt.Printf("wrote %s (OCI image layout), image %s tagged %s\n", out, d, o.version)
}

func envEpoch() int64 {
	v, _ := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64)
	return v
}

// build returns the image of o's binary.
func build(o *options) (v1.Image, error) {
	bin, err := os.ReadFile(o.binary)
	if err != nil {
		return nil, fmt.Errorf("read --binary: %w (make image builds it)", err)
	}
	if !bytes.HasPrefix(bin, []byte("\x7fELF")) {
		return nil, fmt.Errorf("--binary %s is not a Linux (ELF) binary: build it with GOOS=linux CGO_ENABLED=0", o.binary)
	}
	if bytes.Contains(bin, []byte("ld-linux")) || bytes.Contains(bin, []byte("ld-musl")) {
		return nil, fmt.Errorf("--binary %s is linked dynamically; the image has no C library: build it with CGO_ENABLED=0", o.binary)
	}
	ca, err := os.ReadFile(o.caCerts)
	if err != nil {
		return nil, fmt.Errorf("read --ca-certs: %w (Debian: apt-get install ca-certificates)", err)
	}
	layerTar, err := rootfs(o, bin, ca)
	if err != nil {
		return nil, err
	}
	// Compressed once, here: the layer's digest, the layout and the
	// push all read these bytes (ggcr would compress again for each).
	var gz bytes.Buffer
	// No name, no time: the same bytes each build. BestSpeed is what ggcr
	// uses by default.
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(layerTar); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gz.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer: layer, MediaType: types.OCILayer,
		History: v1.History{Created: v1.Time{Time: o.created}, CreatedBy: "deploy/image: ferry " + o.version, Comment: "static ferry binary, CA certificates, user ferry"},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", o.arch
	cf.Created = v1.Time{Time: o.created}
	cf.Config = v1.Config{
		User:       strconv.Itoa(uid) + ":" + strconv.Itoa(uid),
		Entrypoint: []string{binaryPath},
		Cmd:        []string{"run"},
		WorkingDir: homeDir,
		Env: []string{
			"PATH=/usr/local/bin",
			"SSL_CERT_FILE=" + caPath,
			// Probes and scrapes come from outside the container.
			"FERRY_METRICS_ADDR=:9464",
		},
		ExposedPorts: map[string]struct{}{"9464/tcp": {}},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "ferry",
			"org.opencontainers.image.description": "Ferry's relay daemon and operator command: the transactional outbox, relayed",
			"org.opencontainers.image.version":     o.version,
			"org.opencontainers.image.revision":    o.commit,
			"org.opencontainers.image.source":      o.source,
			"org.opencontainers.image.created":     o.created.Format(time.RFC3339),
		},
	}
	return mutate.ConfigFile(img, cf)
}

// rootfs returns the image's one layer, as a tar.
func rootfs(o *options, bin, ca []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(name string, mode int64, owner int) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, Uid: owner, Gid: owner, ModTime: o.created, Format: tar.FormatPAX})
	}
	file := func(name string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: o.created, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nferry:x:%d:%d:ferry:%s:/sbin/nologin\n", uid, uid, homeDir)
	group := fmt.Sprintf("root:x:0:\nnobody:x:65534:\nferry:x:%d:\n", uid)
	err := errors.Join(
		dir("etc", 0o755, 0),
		file("etc/passwd", 0o644, []byte(passwd)),
		file("etc/group", 0o644, []byte(group)),
		// Go's resolver reads it: files first, then DNS.
		file("etc/nsswitch.conf", 0o644, []byte("hosts: files dns\n")),
		dir("etc/ssl", 0o755, 0),
		dir("etc/ssl/certs", 0o755, 0),
		file(caPath[1:], 0o644, ca),
		dir("home", 0o755, 0),
		dir(homeDir[1:], 0o700, uid),
		dir("tmp", 0o1777, 0),
		dir("usr", 0o755, 0),
		dir("usr/local", 0o755, 0),
		dir("usr/local/bin", 0o755, 0),
		file(binaryPath[1:], 0o755, bin),
		tw.Close(),
	)
	return buf.Bytes(), err
}

// writeLayout writes img as an OCI image layout in dir, tagged tag.
func writeLayout(dir string, img v1.Image, tag string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendImage(img, layout.WithAnnotations(map[string]string{refName: tag}))
}
