package control

import (
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// FieldSealer encrypts a credential bound to a team and a scope
// (secret.Secrets implements it with the secrets key).
type FieldSealer interface {
	SealField(teamID, scope, value string) (string, error)
	OpenField(teamID, scope, sealed string) (string, error)
}

// scopeEgressProxyPassword binds a sealed password to its field: sealed
// bytes copied into another field or team do not open.
const scopeEgressProxyPassword = "network.egressProxy.password"

// sealNetwork encrypts n's egress proxy password for storage.
func (m *Manager) sealNetwork(teamID string, n *store.Network) error {
	ep := n.EgressProxy
	if m.cfg.Sealer == nil || ep == nil || ep.Password == "" || ep.PasswordSealed {
		return nil
	}
	s, err := m.cfg.Sealer.SealField(teamID, scopeEgressProxyPassword, ep.Password)
	if err != nil {
		return err
	}
	cp := *ep
	cp.Password, cp.PasswordSealed = s, true
	n.EgressProxy = &cp
	return nil
}

// policyFor is the node policy of a stored network, its proxy password
// opened. A password that no longer opens (the secrets key was replaced)
// is dropped: the upstream then refuses the tunnel, so egress fails closed
// rather than going out directly.
func (m *Manager) policyFor(teamID string, n store.Network) network.Policy {
	if ep := n.EgressProxy; ep != nil && ep.PasswordSealed {
		cp := *ep
		cp.Password, cp.PasswordSealed = "", false
		if m.cfg.Sealer != nil {
			v, err := m.cfg.Sealer.OpenField(teamID, scopeEgressProxyPassword, ep.Password)
			if err != nil {
				m.log.Error("egress proxy password unreadable; the sandbox's tunnel will fail", "err", err)
			} else {
				cp.Password = v
			}
		}
		n.EgressProxy = &cp
	}
	return policyOf(n)
}
