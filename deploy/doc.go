// Package deploy holds what runs Ferry where teams run services: the OCI
// image builder (image/), the Helm chart (helm/ferry) and the Prometheus
// alert rules (prometheus/), with the tests that check them. It is a
// development module: go.work uses it, no release tags it.
package deploy
