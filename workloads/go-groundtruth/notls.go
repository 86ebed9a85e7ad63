//go:build notls

// The no-TLS build (tlsprof-go-crypto): crypto/* without crypto/tls, as a
// JWT signer or a key server links it. Nothing imports the vendored x/crypto
// then, so ChaCha20-Poly1305 and X25519 are absent (nil): their categories
// are off, and --mix naming them is an error. P-256 ECDH goes through
// crypto/elliptic's ScalarMult in both builds, as a key server would call it.
package main

import "crypto/cipher"

var (
	x25519              func(scalar, point []byte) ([]byte, error)
	newChaCha20Poly1305 func(key []byte) (cipher.AEAD, error)
)

func linkTLS() bool { return true }
