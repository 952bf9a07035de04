// Package confval holds the values a configuration file writes as text: a
// duration ("30s") and a memory size ("16GiB").
//
// Each keeps the text it was read from and its parse error instead of
// failing the decode, so that the validator of the section that holds it
// reports the problem under the field's path (admission.queue.timeout:
// invalid duration "soon") beside every other problem of the file, not as
// the YAML decoder's line and Go type. They implement
// encoding.TextUnmarshaler, which go.yaml.in/yaml/v3 calls for a scalar, so
// a package whose configuration types hold them needs no YAML import.
//
// The gateway's file and admission's class, queue and backfill settings
// share these types: one reading of "30s" and "16GiB" for the whole file.
package confval
