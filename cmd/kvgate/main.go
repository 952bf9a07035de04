package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const (
	exitOK    = 0
	exitNo    = 1
	exitUsage = 2
)

// command is one subcommand. run returns the process exit code.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// commands lists the subcommands that exist; one that is not built is not
// listed.
func commands() []command {
	return []command{
		{"kv", "KV-cache bytes per token and per block for a model config", runKV},
		{"plan", "capacity plan: KV budget, tokens and concurrency per GPU", runPlan},
		{"sim", "a simulated vLLM server with a fixed KV-block pool that overflows as a GPU does", runSim},
		{"serve", "run the gateway (with no --config: an embedded demo with a simulated backend)", runServe},
		{"loadtest", "find the safe concurrency or rate of an OpenAI-compatible server", runLoadtest},
		{"gpus", "this node's GPUs and the processes holding their memory, printed or served (--listen) for gpu_watch", runGpus},
		{"health", "exit 0 when a gateway's /readyz answers 200 (the container's HEALTHCHECK)", runHealth},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return exitOK
	case "-version", "--version", "version":
		fmt.Fprintln(stdout, versionString())
		return exitOK
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "kvgate: unknown command %q\n\n", args[0])
	usage(stderr)
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprint(w, "kvgate keeps LLM serving inside its GPU memory budget.\n\nUsage: kvgate <command> [flags]\n\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, "\nRun 'kvgate <command> --help' for a command's flags, 'kvgate --version' for the build.\n"+
		"Exit codes: 0 ok, 1 the answer is no or a run-time failure, 2 bad usage or input.\n")
}

// newFlags makes a subcommand's flag set; its usage text goes to stderr
// when parsing fails and to stdout on --help.
func newFlags(name, synopsis string, stdout, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvgate "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: kvgate %s %s\n\nFlags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args; ok is false when the caller should return code.
// --help goes to stdout and exits 0; a bad flag prints the usage to stderr.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) (code int, ok bool) {
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "-help" || a == "--help" || a == "--h" {
			out := fs.Output()
			fs.SetOutput(stdout)
			fs.Usage()
			fs.SetOutput(out)
			return exitOK, false
		}
	}
	if err := fs.Parse(args); err != nil {
		return exitUsage, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return exitUsage, false
	}
	return 0, true
}

// fail prints a message naming the command and returns code.
func fail(stderr io.Writer, cmd string, code int, format string, a ...any) int {
	fmt.Fprintf(stderr, "kvgate %s: %s\n", cmd, fmt.Sprintf(format, a...))
	return code
}
