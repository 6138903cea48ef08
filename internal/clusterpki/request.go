package clusterpki

import (
	"fmt"
	"net/http"
	"time"
)

// RequestNode is the node an HTTPS request comes from: the client
// certificate it presented (the TLS layer has already checked that the
// client holds its key) must chain to ca and name a node (NodeID). A
// request without one is ErrIdentity.
func (ca *CA) RequestNode(r *http.Request, now time.Time) (string, error) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return "", fmt.Errorf("%w: no client certificate", ErrIdentity)
	}
	return ca.NodeID(r.TLS.PeerCertificates[0], now)
}
