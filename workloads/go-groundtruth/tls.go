//go:build !notls

// The TLS build (tlsprof-go-groundtruth and -stripped): crypto/tls is linked,
// and with it the std's vendored x/crypto that ChaCha20-Poly1305 is reached
// through, as crypto/tls calls it. From Go 1.23 the linker refuses pull-only
// linknames into the std unless built with -ldflags=-checklinkname=0 (the
// trixie root's Go 1.24 build does). It resolves only when crypto/tls links
// the package in.
package main

import (
	"crypto/cipher"
	"crypto/tls"
	_ "unsafe" // go:linkname
)

//go:linkname linkedChaCha20Poly1305 vendor/golang.org/x/crypto/chacha20poly1305.New
func linkedChaCha20Poly1305(key []byte) (cipher.AEAD, error)

var newChaCha20Poly1305 = linkedChaCha20Poly1305

// Link crypto/tls's connection code in, as in every Go TLS server.
var tlsHandshake = (*tls.Conn).Handshake

func linkTLS() bool { return tlsHandshake != nil }
