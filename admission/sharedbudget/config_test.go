package sharedbudget

import (
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// parse reads a shared_budget section and validates it.
func parse(t *testing.T, y string) (*Config, error) {
	t.Helper()
	var c Config
	if err := yaml.Unmarshal([]byte(y), &c); err != nil {
		t.Fatal(err)
	}
	return &c, c.Validate()
}

// The section's defaults, and every mistake named by its field's path in
// the gateway's config (never echoing a Redis password).
func TestConfig(t *testing.T) {
	sb, err := parse(t, "{redis: 'redis://127.0.0.1:6379/0', replicas: 3}")
	if err != nil {
		t.Fatal(err)
	}
	if sb.LeaseTTL.D != 3*time.Second || sb.KeyPrefix != "kvgate:" || sb.LengthsInterval.D != 2*time.Second ||
		sb.Chunk.String() != "2%" || sb.Chunk.Of(1000) != 20 || !strings.Contains(sb.Replica, "-") {
		t.Errorf("defaults: %+v (chunk %s)", sb, sb.Chunk)
	}
	// A silent replica's lease counts until what it admitted has ended: a
	// lease admits nothing past its TTL, a request ends within the request
	// timeout.
	if got := sb.residual(10 * time.Minute); got != 3*time.Second+10*time.Minute {
		t.Errorf("default residual_ttl with a 10m request timeout: %v, want lease_ttl + 10m", got)
	}
	if c, err := parse(t, "{redis: 'redis://h:1/0', replicas: 1, lease_ttl: 2s, residual_ttl: 2s}"); err != nil || c.residual(time.Minute) != 2*time.Second {
		t.Errorf("residual_ttl set to lease_ttl: %v, %v; want 2s", err, c.residual(time.Minute))
	}
	if sb.ResidualRelease != ReleaseEvidence {
		t.Errorf("default residual_release %q, want evidence", sb.ResidualRelease)
	}
	if !sb.redisOpts.ContextTimeoutEnabled {
		t.Error("the Redis client would ignore a call's deadline on its socket")
	}
	if a, b := defaultReplica(), defaultReplica(); a == b {
		t.Errorf("two processes' default replica names can collide: %q", a)
	}
	for _, tc := range []struct {
		chunk string
		of    int64
	}{{"5%", 50}, {"0.5%", 5}, {"64MiB", 64 << 20}, {"1", 1}} {
		c, err := parse(t, "{redis: 'redis://h:1/0', replicas: 1, chunk: '"+tc.chunk+"'}")
		if err != nil {
			t.Fatalf("chunk %s: %v", tc.chunk, err)
		}
		if got := c.Chunk.Of(1000); got != tc.of {
			t.Errorf("chunk %s of 1000: %d, want %d", tc.chunk, got, tc.of)
		}
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"no redis", "{replicas: 2}", "shared_budget.redis: required"},
		{"bad redis url", "{redis: 'http://user:hunter2@h:1', replicas: 2}", "shared_budget.redis: http://***@h:1 is not"},
		{"no replicas", "{redis: 'redis://h:1/0'}", "shared_budget.replicas: required"},
		{"ttl too short", "{redis: 'redis://h:1/0', replicas: 2, lease_ttl: 10ms}", "shared_budget.lease_ttl: 10ms is below 100ms"},
		{"ttl not a duration", "{redis: 'redis://h:1/0', replicas: 2, lease_ttl: soon}", "shared_budget.lease_ttl: invalid duration"},
		{"ttl negative", "{redis: 'redis://h:1/0', replicas: 2, lease_ttl: -1s}", "shared_budget.lease_ttl: invalid duration"},
		{"chunk percent", "{redis: 'redis://h:1/0', replicas: 2, chunk: '150%'}", "shared_budget.chunk: \"150%\": a percentage must be in"},
		{"chunk size", "{redis: 'redis://h:1/0', replicas: 2, chunk: lots}", "shared_budget.chunk: invalid memory size"},
		{"chunk zero", "{redis: 'redis://h:1/0', replicas: 2, chunk: '0'}", "shared_budget.chunk: \"0\": must be more than 0 bytes"},
		{"replica name", "{redis: 'redis://h:1/0', replicas: 2, replica: 'a b'}", "shared_budget.replica"},
		{"lengths interval", "{redis: 'redis://h:1/0', replicas: 2, lengths_interval: 1ms}", "shared_budget.lengths_interval"},
		{"residual release", "{redis: 'redis://h:1/0', replicas: 2, residual_release: guess}", `shared_budget.residual_release: "guess": evidence`},
		{"residual below the ttl", "{redis: 'redis://h:1/0', replicas: 2, residual_ttl: 1s}", "shared_budget.residual_ttl: 1s is below lease_ttl 3s"},
		{"residual not a duration", "{redis: 'redis://h:1/0', replicas: 2, residual_ttl: later}", "shared_budget.residual_ttl: invalid duration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.yaml)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v\nwant it to contain %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
	var none *Config
	if err := none.Validate(); err != nil {
		t.Errorf("no section: %v", err)
	}
}

func TestSameAs(t *testing.T) {
	base := "{redis: 'redis://h:1/0', replicas: 2, replica: a}"
	a, _ := parse(t, base)
	for _, tc := range []struct {
		yaml string
		same bool
	}{
		{base, true},
		{"{redis: 'redis://h:1/0', replicas: 2, replica: b}", true}, // the name is the running process's
		{"{redis: 'redis://h:2/0', replicas: 2, replica: a}", false},
		{"{redis: 'redis://h:1/0', replicas: 3, replica: a}", false},
		{"{redis: 'redis://h:1/0', replicas: 2, replica: a, chunk: 5%}", false},
		{"{redis: 'redis://h:1/0', replicas: 2, replica: a, lease_ttl: 4s}", false},
		{"{redis: 'redis://h:1/0', replicas: 2, replica: a, residual_ttl: 4s}", false},
	} {
		b, err := parse(t, tc.yaml)
		if err != nil {
			t.Fatal(err)
		}
		if got := a.SameAs(b); got != tc.same {
			t.Errorf("SameAs(%s) = %v, want %v", tc.yaml, got, tc.same)
		}
	}
	if !(*Config)(nil).SameAs(nil) || a.SameAs(nil) {
		t.Error("nil sections")
	}
}
