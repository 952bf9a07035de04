// Command kvgate is an inference gateway that keeps LLM serving inside its
// GPU memory budget, with the tools to size and test one: serve (the
// gateway, or with no config an embedded demo), sim (a vLLM-style simulated
// backend), loadtest (find a deployment's safe concurrency), plan and kv
// (the KV-cache arithmetic of a model on a GPU).
//
// Each subcommand is one file and one entry of commands(); one that is not
// built is not listed. This package only parses flags and wires packages
// together: every decision lives in the packages it calls.
//
// Exit codes, for scripts: 0 success; 1 the command ran but the answer is no
// (the weights do not fit, no load level was safe) or it failed at run time;
// 2 bad usage or bad input (a flag, a file, a value), with a message naming
// the flag.
package main
