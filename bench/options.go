package bench

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Scenarios, in the order they run for each contender; "consume" runs
// the consumers (AllConsumers) after the relay contenders.
var AllScenarios = []string{"ceiling", "produce", "ladder", "latency", "drain", "consume"}

// Options configure a benchmark run.
type Options struct {
	Quick       bool
	DatabaseURL string
	NATSURL     string
	// Out is the results folder; created if missing.
	Out        string
	Contenders []string
	Scenarios  []string
	// Consumers are the consume scenario's contenders (default
	// AllConsumers).
	Consumers []string
	// ConsumeEvents and ConsumeKeys override the profile's consume backlog
	// when positive.
	ConsumeEvents, ConsumeKeys int
	Repeat                     int
	// Producers is the number of producer goroutines (and connections).
	Producers int
	// Keys is the number of accounts, that is event keys.
	Keys int
	// SchemaPrefix starts every contender's schema name. Default "bench_".
	SchemaPrefix string
	// Keep leaves the schemas in place after the run.
	Keep bool
	// Profile overrides the quick/full profile (tests use a smaller one).
	Profile *Profile
	// CPUProfiles has the relay child write a CPU profile of every phase
	// to the results folder (pprof/<contender>-<scenario>-<param>.pprof).
	CPUProfiles bool
	Log         io.Writer
	// RelayCommand builds the command that runs `relay` with args in a
	// child process. Default: this executable, with RelayEnv=1.
	RelayCommand func(args []string) *exec.Cmd
}

// Profile sets the sizes and durations of a run.
type Profile struct {
	Name string
	// CeilingDuration is the length of each closed-loop producer ceiling
	// (no relay), with synchronous_commit on and off.
	CeilingDuration time.Duration
	// ProduceDuration is the length of the closed-loop producer run with
	// the relay running.
	ProduceDuration time.Duration
	// PublishCount is the number of events of the publish-only ceilings.
	PublishCount int
	// Ladder is the offered rates of the sustained-rate search.
	Ladder []int
	// LadderDown tries 1/2, 1/4 and 1/10 of the first rate when a
	// contender fails it, so that its maximum (and 50% of it) is known.
	LadderDown bool
	// Warmup and Steady are the parts of each fixed-rate step; the
	// criteria are evaluated over the steady window.
	Warmup, Steady time.Duration
	// FixedRates are the latency rates run for every contender.
	FixedRates []int
	// HalfMax adds a latency run at 50% of each contender's sustained rate.
	HalfMax bool
	// Drains are the backlog sizes.
	Drains []int
	// Grace is how long delivery may stall before what is undelivered
	// counts as missing.
	Grace time.Duration
	// MaxWait bounds the wait for delivery after a fixed-rate or
	// closed-loop phase; DrainMaxWait after a drain's start.
	MaxWait, DrainMaxWait time.Duration
	// Checkpoint runs CHECKPOINT between phases.
	Checkpoint bool
	// MaxEvents caps a closed-loop phase's events.
	MaxEvents int
	// ConsumeEvents is the consume scenario's backlog (0 skips it), over
	// ConsumeKeys keys (default 500).
	ConsumeEvents, ConsumeKeys int
}

// QuickProfile is the CI-smoke-sized profile (--quick), about 3 minutes
// for all contenders.
func QuickProfile() *Profile {
	return &Profile{
		Name:            "quick",
		CeilingDuration: time.Second,
		ProduceDuration: 1500 * time.Millisecond,
		PublishCount:    20000,
		Ladder:          []int{1000, 5000},
		Warmup:          time.Second,
		Steady:          3 * time.Second,
		FixedRates:      []int{1000, 5000},
		HalfMax:         false,
		Drains:          []int{10000},
		Grace:           2500 * time.Millisecond,
		MaxWait:         10 * time.Second,
		DrainMaxWait:    60 * time.Second,
		Checkpoint:      false,
		MaxEvents:       400000,
		ConsumeEvents:   5000,
		ConsumeKeys:     500,
	}
}

// FullProfile is the measurement profile.
func FullProfile() *Profile {
	return &Profile{
		Name:            "full",
		CeilingDuration: 8 * time.Second,
		ProduceDuration: 10 * time.Second,
		PublishCount:    200000,
		// Steps of 500 where two cores' contenders top out, so that
		// a sustained rate is not hidden by a 1,000-wide step.
		Ladder:        []int{1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000, 6000, 7000, 8000, 10000, 20000, 40000, 80000},
		LadderDown:    true,
		Warmup:        5 * time.Second,
		Steady:        20 * time.Second,
		FixedRates:    []int{1000, 5000},
		HalfMax:       true,
		Drains:        []int{10000, 100000, 1000000},
		Grace:         10 * time.Second,
		MaxWait:       60 * time.Second,
		DrainMaxWait:  15 * time.Minute,
		Checkpoint:    true,
		MaxEvents:     2000000,
		ConsumeEvents: 20000,
		ConsumeKeys:   500,
	}
}

func (o *Options) withDefaults() (Options, error) {
	out := *o
	if out.DatabaseURL == "" {
		out.DatabaseURL = "postgres://postgres@127.0.0.1:5432/test"
	}
	if out.NATSURL == "" {
		out.NATSURL = "nats://127.0.0.1:4222"
	}
	if out.Out == "" {
		out.Out = "results/" + time.Now().Format("20060102-150405")
	}
	if len(out.Contenders) == 0 {
		out.Contenders = AllContenders
	}
	if len(out.Scenarios) == 0 {
		out.Scenarios = AllScenarios
	}
	for _, c := range out.Contenders {
		if !slices.Contains(AllContenders, c) {
			return out, fmt.Errorf("unknown contender %q (known: %s)", c, strings.Join(AllContenders, ","))
		}
	}
	for _, s := range out.Scenarios {
		if !slices.Contains(AllScenarios, s) {
			return out, fmt.Errorf("unknown scenario %q (known: %s)", s, strings.Join(AllScenarios, ","))
		}
	}
	if len(out.Consumers) == 0 {
		out.Consumers = AllConsumers
	}
	for _, c := range out.Consumers {
		if !slices.Contains(AllConsumers, c) {
			return out, fmt.Errorf("unknown consumer %q (known: %s)", c, strings.Join(AllConsumers, ","))
		}
	}
	if out.SchemaPrefix == "" {
		out.SchemaPrefix = "bench_"
	}
	if !identRE.MatchString(out.SchemaPrefix) {
		return out, fmt.Errorf("schema prefix %q: use letters, digits and underscores", out.SchemaPrefix)
	}
	if out.Repeat <= 0 {
		out.Repeat = 1
	}
	if out.Producers <= 0 {
		out.Producers = 32
	}
	if out.Keys <= 0 {
		out.Keys = 1000
	}
	if out.Profile == nil {
		if out.Quick {
			out.Profile = QuickProfile()
		} else {
			out.Profile = FullProfile()
		}
	}
	if out.ConsumeEvents > 0 || out.ConsumeKeys > 0 || out.Profile.ConsumeKeys <= 0 {
		p := *out.Profile
		if out.ConsumeEvents > 0 {
			p.ConsumeEvents = out.ConsumeEvents
		}
		if out.ConsumeKeys > 0 {
			p.ConsumeKeys = out.ConsumeKeys
		}
		if p.ConsumeKeys <= 0 {
			p.ConsumeKeys = 500
		}
		out.Profile = &p
	}
	if out.Log == nil {
		out.Log = os.Stderr
	}
	if out.RelayCommand == nil {
		out.RelayCommand = func(args []string) *exec.Cmd {
			exe, err := os.Executable()
			if err != nil {
				exe = os.Args[0]
			}
			cmd := exec.Command(exe, args...)
			cmd.Env = append(os.Environ(), RelayEnv+"=1")
			return cmd
		}
	}
	return out, nil
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,40}$`)

func (o *Options) has(scenario string) bool { return slices.Contains(o.Scenarios, scenario) }

// hasRelay says whether a scenario with a relay contender is selected.
func (o *Options) hasRelay() bool {
	return slices.ContainsFunc(o.Scenarios, func(s string) bool { return s != "consume" })
}
