package sharedbudget

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"

	"github.com/kvgate/kvgate/internal/confval"
	"github.com/kvgate/kvgate/kvbudget"
)

// Config is the gateway's shared_budget section. It makes the gateway one
// replica of a fleet that shares each GPU's budget through Redis: every
// replica in front of the same backends leases its part of the budget
// there, so that together they admit what the GPU holds, not that many
// times over. Without it (the default) the budget is this process's alone.
// A reload cannot change it.
type Config struct {
	// Redis is the server keeping the leases:
	// redis://[user:password@]host:port/db, or rediss:// for TLS.
	// Required.
	Redis string `yaml:"redis"`
	// Replicas is how many gateway replicas share the budgets. While Redis
	// is unreachable each admits at most budget / replicas (its static
	// share), never the whole budget. Required, at least 1.
	Replicas int `yaml:"replicas"`
	// LeaseTTL is how long a lease lives without renewal: a replica that
	// dies (kill -9) gives its part back after it. Renewal runs every
	// LeaseTTL/3. Default 3s; at least 100ms.
	LeaseTTL Duration `yaml:"lease_ttl"`
	// Chunk is the unit in which a replica leases and gives back capacity:
	// a percentage of each GPU's configured budget ("2%") or a size
	// ("64MiB"). A replica leaves less than a chunk idle per GPU, and each
	// change of its demand by a chunk costs one round trip to Redis.
	// Default 2%: at most 2% of a GPU per replica leased but unused, and a
	// round trip per 2% of the budget that demand moves.
	Chunk Chunk `yaml:"chunk"`
	// KeyPrefix namespaces the Redis keys, so that several fleets can share
	// one Redis. Default "kvgate:".
	KeyPrefix string `yaml:"key_prefix"`
	// Replica names this process in the fleet, in Redis and on /status. It
	// must be unique per running process: two processes with one name
	// would hold one lease between them. Default hostname-pid-random.
	Replica string `yaml:"replica"`
	// LengthsInterval is how often the output lengths this replica learned
	// are sent to the fleet and the others' read back. Default 2s.
	LengthsInterval Duration `yaml:"lengths_interval"`
	// ResidualTTL is how long after a replica's last call to Redis its
	// lease still counts: past LeaseTTL it is the replica's residual hold,
	// which the others may not lease, because a replica that stopped
	// calling may be paused or cut off with its requests still running on
	// the GPU. Default LeaseTTL + the gateway's request timeout: a lease
	// admits nothing past its TTL, and a request ends within the request
	// timeout. At least LeaseTTL; LeaseTTL frees a silent replica's lease
	// with its TTL, as if its requests always died with it.
	ResidualTTL Duration `yaml:"residual_ttl"`
	// ResidualRelease says what else ends a residual hold before
	// ResidualTTL: "evidence" (the default) ends it once the backends'
	// reported use of the GPU is covered by the live replicas' published
	// holds, within the reconciliation's tolerance, for two reports in a
	// row — a killed replica's requests were aborted with its connections,
	// a paused or cut-off one's still run and show; "timer" leaves it to
	// ResidualTTL alone. Evidence needs admission.reconcile on.
	ResidualRelease string `yaml:"residual_release"`

	// redisOpts is Redis parsed.
	redisOpts *redis.Options
}

// Defaults of the shared budget.
const (
	defaultLeaseTTL        = 3 * time.Second
	minLeaseTTL            = 100 * time.Millisecond
	defaultChunkPercent    = 2
	defaultKeyPrefix       = "kvgate:"
	defaultLengthsInterval = 2 * time.Second
	// ReleaseEvidence and ReleaseTimer are ResidualRelease's values.
	ReleaseEvidence    = "evidence"
	ReleaseTimer       = "timer"
	minLengthsInterval = 10 * time.Millisecond
)

// Duration is the file's duration type, shared with the gateway's other
// sections so that a bad value is reported the same way, with its path.
type Duration = confval.Duration

// Chunk is a size or a percentage of a budget ("2%", "64MiB").
type Chunk struct {
	Percent float64 // > 0 for a percentage
	Bytes   int64   // > 0 for a size
	raw     string
	err     error
}

// UnmarshalYAML keeps any parse error for validation.
func (c *Chunk) UnmarshalYAML(n *yaml.Node) error {
	c.raw = strings.TrimSpace(n.Value)
	if p, ok := strings.CutSuffix(c.raw, "%"); ok {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || !(v > 0 && v <= 100) {
			c.err = fmt.Errorf("%q: a percentage must be in (0%%, 100%%]", n.Value)
			return nil
		}
		c.Percent = v
		return nil
	}
	sz, err := kvbudget.ParseSize(c.raw)
	switch {
	case err != nil:
		c.err = fmt.Errorf("%w (or a percentage of the budget, e.g. 2%%)", err)
	case sz.Bytes <= 0:
		c.err = fmt.Errorf("%q: must be more than 0 bytes", n.Value)
	default:
		c.Bytes = sz.Bytes
	}
	return nil
}

// Of is the chunk for a budget (at least 1: in admission mode count a
// budget is a few requests).
func (c Chunk) Of(budget int64) int64 {
	if c.Bytes > 0 {
		return c.Bytes
	}
	p := c.Percent
	if p == 0 {
		p = defaultChunkPercent
	}
	return max(1, int64(float64(budget)*p/100+0.999999))
}

func (c Chunk) String() string {
	if c.Bytes > 0 {
		return kvbudget.FormatBytes(c.Bytes)
	}
	p := c.Percent
	if p == 0 {
		p = defaultChunkPercent
	}
	return strconv.FormatFloat(p, 'g', -1, 64) + "%"
}

// Validate fills the section's defaults and returns its problems, each
// with its field's path in the gateway's config (shared_budget.lease_ttl);
// nil for a nil section, which has none.
func (sb *Config) Validate() error {
	if sb == nil {
		return nil
	}
	const f = "shared_budget"
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, a...)))
	}
	if sb.Redis == "" {
		bad(f+".redis", "required (redis://host:6379/0)")
	} else if o, err := redis.ParseURL(sb.Redis); err != nil {
		// go-redis's message may quote the URL: never echo a password.
		bad(f+".redis", "%s is not a redis:// or rediss:// URL of a server (redis://[user:password@]host:port/db)", redactURL(sb.Redis))
	} else {
		// Without it go-redis bounds socket I/O by its own read and write
		// timeouts alone and ignores a call's context deadline: a lease would
		// stay trusted while Redis sleeps or the link is blackholed, long
		// after the lessee stopped trusting it.
		o.ContextTimeoutEnabled = true
		sb.redisOpts = o
	}
	if sb.Replicas < 1 {
		bad(f+".replicas", "required: how many replicas share the budgets (at least 1); each falls back to budget/replicas while Redis is unreachable")
	}
	// duration fills d's default, or reports it bad or below least.
	duration := func(field string, d *Duration, def, least time.Duration) {
		switch {
		case d.Err() != nil:
			bad(field, "%v", d.Err())
		case d.D == 0:
			d.D = def
		case d.D < least:
			bad(field, "%v is below %v", d.D, least)
		}
	}
	duration(f+".lease_ttl", &sb.LeaseTTL, defaultLeaseTTL, minLeaseTTL)
	if sb.Chunk.err != nil {
		bad(f+".chunk", "%v", sb.Chunk.err)
	}
	if sb.KeyPrefix == "" {
		sb.KeyPrefix = defaultKeyPrefix
	}
	if sb.Replica == "" {
		sb.Replica = defaultReplica()
	} else if strings.ContainsAny(sb.Replica, " \t\r\n") {
		bad(f+".replica", "%q must not contain white space", sb.Replica)
	}
	duration(f+".lengths_interval", &sb.LengthsInterval, defaultLengthsInterval, minLengthsInterval)
	// Its default needs the request timeout, which is the gateway's: New
	// resolves it (residual).
	switch r := sb.ResidualTTL; {
	case r.Err() != nil:
		bad(f+".residual_ttl", "%v", r.Err())
	case r.D != 0 && r.D < sb.LeaseTTL.D:
		bad(f+".residual_ttl", "%v is below lease_ttl %v: a lease must count at least as long as it lives", r.D, sb.LeaseTTL.D)
	}
	switch sb.ResidualRelease {
	case "":
		sb.ResidualRelease = ReleaseEvidence
	case ReleaseEvidence, ReleaseTimer:
	default:
		bad(f+".residual_release", "%q: evidence (the backend's figures end a silent replica's hold) or timer (residual_ttl alone)", sb.ResidualRelease)
	}
	return errors.Join(errs...)
}

// SameAs says whether two resolved sections describe the same fleet
// membership (a reload keeps the running one otherwise).
func (sb *Config) SameAs(o *Config) bool {
	if sb == nil || o == nil {
		return sb == o
	}
	return sb.Redis == o.Redis && sb.Replicas == o.Replicas && sb.LeaseTTL.D == o.LeaseTTL.D && sb.Chunk.Percent == o.Chunk.Percent &&
		sb.Chunk.Bytes == o.Chunk.Bytes && sb.KeyPrefix == o.KeyPrefix && sb.LengthsInterval.D == o.LengthsInterval.D &&
		sb.ResidualTTL.D == o.ResidualTTL.D && sb.ResidualRelease == o.ResidualRelease
}

// residual is ResidualTTL resolved: its default is LeaseTTL plus the
// request timeout.
func (sb *Config) residual(requestTimeout time.Duration) time.Duration {
	if sb.ResidualTTL.D > 0 {
		return sb.ResidualTTL.D
	}
	return sb.LeaseTTL.D + max(requestTimeout, 0)
}

// defaultReplica is hostname-pid-random: unique per process, and telling
// an operator which machine and process a lease belongs to.
func defaultReplica() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "kvgate"
	}
	var b [3]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// redactURL hides a URL's password (and user) for logs, errors and
// /status.
func redactURL(u string) string {
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok {
		return "the value given"
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		rest = "***@" + rest[at+1:]
	}
	return scheme + "://" + rest
}
