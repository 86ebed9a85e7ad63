//go:build go1.20

// Go 1.20+: crypto/tls runs its X25519 and P-256 key shares through
// crypto/ecdh; so do these categories. The private key of each is made once
// (it is the ground truth's fixed key, as the C runner's) and the peer's
// public key per operation, as a handshake parses its peer's share.
package main

import (
	"crypto/ecdh"
	"errors"
)

type ecdhKey struct {
	raw  string
	priv *ecdh.PrivateKey
}

var x25519Key, p256Key ecdhKey

func (k *ecdhKey) shared(curve ecdh.Curve, priv, peer []byte) ([]byte, error) {
	if k.priv == nil || k.raw != string(priv) {
		key, err := curve.NewPrivateKey(priv)
		if err != nil {
			return nil, err
		}
		k.raw, k.priv = string(priv), key
	}
	pub, err := curve.NewPublicKey(peer)
	if err != nil {
		return nil, err
	}
	return k.priv.ECDH(pub)
}

func init() {
	x25519 = func(scalar, point []byte) ([]byte, error) { return x25519Key.shared(ecdh.X25519(), scalar, point) }
	p256ECDH = func(priv, peer []byte) (byte, error) {
		// crypto/elliptic.GenerateKey's scalar is big-endian, possibly short.
		if len(priv) != 32 {
			return 0, errors.New("P-256 private key is not 32 bytes")
		}
		s, err := p256Key.shared(ecdh.P256(), priv, peer)
		if err != nil {
			return 0, err
		}
		return s[0], nil
	}
}
