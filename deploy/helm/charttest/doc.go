// Package charttest renders deploy/helm/cubicle with Helm's own engine and
// decodes every manifest strictly into the Kubernetes API types. It is its
// own module so the main module does not pull Kubernetes.
package charttest
