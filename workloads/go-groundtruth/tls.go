//go:build !notls

// The TLS build (tlsprof-go-groundtruth and -stripped): crypto/tls is linked,
// and with it the std's vendored x/crypto that ChaCha20-Poly1305 and X25519
// are reached through.
package main

import (
	"crypto/cipher"
	"crypto/tls"
	_ "unsafe" // go:linkname
)

// The std's vendored x/crypto, as crypto/tls calls it (Go 1.19 only: from
// Go 1.23 the linker refuses pull-only linknames into the std by default).
// They resolve only when crypto/tls links those packages in.
//
//go:linkname linkedX25519 vendor/golang.org/x/crypto/curve25519.X25519
func linkedX25519(scalar, point []byte) ([]byte, error)

//go:linkname linkedChaCha20Poly1305 vendor/golang.org/x/crypto/chacha20poly1305.New
func linkedChaCha20Poly1305(key []byte) (cipher.AEAD, error)

var (
	x25519              = linkedX25519
	newChaCha20Poly1305 = linkedChaCha20Poly1305
)

// Link crypto/tls's connection code in, as in every Go TLS server.
var tlsHandshake = (*tls.Conn).Handshake

func linkTLS() bool { return tlsHandshake != nil }
