//go:build !notls && !go1.20

// Go 1.19: X25519 only in the std's vendored x/crypto, as crypto/tls calls
// it (see tls.go); there is no crypto/ecdh yet.
package main

import _ "unsafe" // go:linkname

//go:linkname linkedX25519 vendor/golang.org/x/crypto/curve25519.X25519
func linkedX25519(scalar, point []byte) ([]byte, error)

func init() { x25519 = linkedX25519 }
