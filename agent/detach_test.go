package main

import (
	"reflect"
	"testing"
)

func TestTheDetachedAgentGetsItsArgumentsWithoutDetachOrAPlainToken(t *testing.T) {
	args := []string{"-detach", "-port", "49983", "-access-token", "secret", "--access-token=again", "-access-token-sha256", "ab"}
	got := withoutValueFlag(withoutFlag(args, "detach"), "access-token")
	want := []string{"-port", "49983", "-access-token-sha256", "ab"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestOnlyALowerCaseHexSHA256IsAccepted(t *testing.T) {
	good := "4f6e1f65055263866dedb3c5fe22defb0cc045648cf0b87afac54cc6420e5647"
	for s, want := range map[string]bool{
		good:            true,
		good[:63]:       false,
		good + "0":      false,
		"4F" + good[2:]: false,
		"zz" + good[2:]: false,
		"":              false,
	} {
		if validSHA256(s) != want {
			t.Errorf("validSHA256(%q) = %v, want %v", s, !want, want)
		}
	}
}
