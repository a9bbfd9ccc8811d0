package rpc

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Uint32 is a uint32 field as protobuf's JSON mapping allows it: a number or a
// decimal string.
type Uint32 uint32

func (u *Uint32) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	if s == "null" {
		return nil
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return fmt.Errorf("%s is not a uint32", b)
	}
	*u = Uint32(n)
	return nil
}

// Int64 is an int64 field: written as a decimal string (protobuf's JSON
// mapping), read from a string or a number.
type Int64 int64

func (i Int64) MarshalJSON() ([]byte, error) {
	return json.Marshal(strconv.FormatInt(int64(i), 10))
}

func (i *Int64) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	if s == "null" {
		return nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("%s is not an int64", b)
	}
	*i = Int64(n)
	return nil
}

// EnumValue reads an enum field given by name or by number, against the enum's
// table of names; unknown names are refused.
func EnumValue(b []byte, enum string, names map[string]int32) (int32, error) {
	var name string
	if err := json.Unmarshal(b, &name); err == nil {
		if v, ok := names[name]; ok {
			return v, nil
		}
		return 0, fmt.Errorf("%q is not a value of enum %s", name, enum)
	}
	var n int32
	if err := json.Unmarshal(b, &n); err != nil {
		return 0, fmt.Errorf("%s is not a value of enum %s", b, enum)
	}
	return n, nil
}
