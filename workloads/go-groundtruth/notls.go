//go:build notls

// The no-TLS build (tlsprof-go-crypto): crypto/* without crypto/tls, as a
// JWT signer or a key server links it. Nothing imports the vendored x/crypto
// then, so ChaCha20-Poly1305 is absent (nil): its category is off, and --mix
// naming it is an error. X25519 too before Go 1.20 (x25519_go119.go needs
// crypto/tls); from 1.20 crypto/ecdh has it (ecdh_go120.go).
package main

import "crypto/cipher"

var newChaCha20Poly1305 func(key []byte) (cipher.AEAD, error)

func linkTLS() bool { return true }
