//go:build go1.24

// Go 1.24: crypto/mlkem, the ML-KEM-768 half of X25519MLKEM768 (crypto/tls
// runs the same code, crypto/internal/fips140/mlkem). One operation is one
// key exchange's both ends: a client's key generation and decapsulation, a
// server's encapsulation.
package main

import (
	"crypto/mlkem"
	"errors"
)

func init() {
	mlKem768 = func() (byte, error) {
		dk, err := mlkem.GenerateKey768()
		if err != nil {
			return 0, err
		}
		shared, ciphertext := dk.EncapsulationKey().Encapsulate()
		got, err := dk.Decapsulate(ciphertext)
		if err != nil {
			return 0, err
		}
		if got[0] != shared[0] {
			return 0, errors.New("ML-KEM-768: the shared secrets differ")
		}
		return got[0], nil
	}
}
