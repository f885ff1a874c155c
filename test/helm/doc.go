// Package helm checks the chart in charts/tollgate offline, with no cluster:
// `helm template` renders it with each values file of charts/tollgate/ci,
// and every rendered object is decoded strictly into Kubernetes' own API
// types (an unknown or misspelt field is an error), then checked against
// what Tollgate needs: the flags `tollgate serve` knows, rules that load,
// probes on the admin port, a locked-down security context, and no secret
// in plain text.
//
// It is its own Go module so that Kubernetes' dependencies never enter the
// main module's build. `make validate` builds bin/helm first and runs it;
// without bin/helm (or $HELM) the tests that render skip and say so.
package helm
