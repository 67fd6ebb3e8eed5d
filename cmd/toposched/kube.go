package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/authcallout"
	"github.com/toposched/toposched/internal/natsflags"
	"github.com/toposched/toposched/metrics"
	"github.com/toposched/toposched/services/kube"
	"github.com/toposched/toposched/services/operator"
)

// roleKube is the Kubernetes service's NATS role and lease key.
const roleKube = "kube"

// inCluster is the --kubeconfig value that means the pod's own
// ServiceAccount.
const inCluster = "in-cluster"

// kubeFlags are the Kubernetes service's flags, on serve and on kube.
type kubeFlags struct {
	kubeconfig string
	cfg        kube.Config
	gpuClasses []string
	qps        float32
	burst      int
}

func (f *kubeFlags) register(fs *pflag.FlagSet, standalone bool) {
	usage := "run the Kubernetes service too, with this kubeconfig, or '" + inCluster + "' for the pod's ServiceAccount (empty: not)"
	def := ""
	if standalone {
		usage = "kubeconfig file, or '" + inCluster + "' for the pod's ServiceAccount (default: in-cluster inside a pod, else $KUBECONFIG or ~/.kube/config)"
		def = os.Getenv("KUBECONFIG")
	}
	fs.StringVar(&f.kubeconfig, "kubeconfig", def, usage)
	fs.StringVar(&f.cfg.SchedulerName, "scheduler-name", kube.DefaultSchedulerName, "schedule the pods whose spec.schedulerName is this")
	fs.StringVar(&f.cfg.GPUDriver, "gpu-driver", kube.DefaultGPUDriver, "the DRA driver whose devices are the GPUs of toposched's topology")
	fs.StringSliceVar(&f.gpuClasses, "gpu-class", nil, "DeviceClasses whose requests are GPUs, one rank each (default: the class named as --gpu-driver)")
	fs.StringVar(&f.cfg.DedicatedTaint, "dedicated-taint", kube.DefaultDedicatedTaint,
		"taint key of nodes dedicated to toposched's pods (they tolerate it); a node with any other NoSchedule or NoExecute taint is left out")
	fs.StringSliceVar(&f.cfg.FabricLabels, "fabric-labels", kube.DefaultFabricLabels,
		"node labels of the fabric's levels, the widest first (zone, block, rack); their tree is published as the fabric unless the cluster file has one (empty: none)")
	fs.IntVar(&f.cfg.Workers, "kube-workers", kube.DefaultWorkers, "gangs, decisions and nodes worked on at once")
	// Each pod costs three writes (the claim's finalizer, its allocation,
	// the binding): 200 requests a second held the service to about 60
	// pods a second where the apiserver gave 80-140 (BENCHMARKS.md, issue
	// 47). The apiserver's priority and fairness, not this limit, is what
	// keeps it from being overrun.
	fs.Float32Var(&f.qps, "kube-qps", 500, "the Kubernetes client's sustained requests per second")
	fs.IntVar(&f.burst, "kube-burst", 1000, "the Kubernetes client's burst of requests")
}

// enabled reports whether serve runs the Kubernetes service.
func (f *kubeFlags) enabled() bool { return f.kubeconfig != "" }

// restConfig is the client configuration the flags name.
func (f *kubeFlags) restConfig() (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	switch f.kubeconfig {
	case inCluster:
		cfg, err = rest.InClusterConfig()
	case "":
		if cfg, err = rest.InClusterConfig(); errors.Is(err, rest.ErrNotInCluster) {
			cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
				clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
		}
	default:
		cfg, err = clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", f.kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = f.qps, f.burst
	cfg.UserAgent = "toposched"
	// Protobuf, as kube-scheduler speaks: encoding the watch streams and
	// the three writes a pod costs is the API server's largest share of
	// CPU per pod, and JSON costs it (and this process decoding it) more.
	// The dynamic client (JobSets, custom resources) sets JSON for itself.
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	return cfg, nil
}

// kubeRun is the Kubernetes service across the terms of its lease.
type kubeRun struct {
	met *kube.Metrics // nil: no metrics
	// cur is the service of the term this replica leads, nil on a
	// standby.
	cur atomic.Pointer[kube.Service]
}

// ready is nil once this replica either stands by or leads with its
// caches synced and its state rebuilt.
func (r *kubeRun) ready() error {
	svc := r.cur.Load()
	if svc == nil {
		return nil // a standby is ready to take over
	}
	select {
	case <-svc.Ready():
		return nil
	default:
		return errors.New("kubernetes service: syncing its caches and rebuilding from the streams")
	}
}

// runKube runs the Kubernetes service, one replica at a time (the lease
// named roleKube), until ctx ends.
func runKube(ctx context.Context, b *bus.Bus, f *kubeFlags, ops *opsFlags, run *kubeRun, log *slog.Logger) error {
	rc, err := f.restConfig()
	if err != nil {
		return err
	}
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	cfg := f.cfg
	cfg.GPUClasses = f.gpuClasses
	holder := ops.replica
	if holder == "" {
		host, _ := os.Hostname()
		holder = host + "/" + fmt.Sprint(os.Getpid()) + "/" + bus.NewID()[:8]
	}
	log = log.With("service", roleKube)
	return operator.Lead(ctx, b, roleKube, holder, ops.leaseTTL, log, func(ctx context.Context) error {
		svc, err := kube.New(cfg, kube.Deps{Kube: kc, Dynamic: dyn, Bus: b, Log: log, Metrics: run.met})
		if err != nil {
			return err
		}
		run.cur.Store(svc)
		run.met.SetLeading(true)
		defer func() {
			run.cur.Store(nil)
			run.met.SetLeading(false)
		}()
		return svc.Run(ctx)
	})
}

// calloutFlags turn on the auth callout responder of toposched kube.
type calloutFlags struct {
	issuerSeed     string // the issuer's account seed
	nkey           string // the responder's own NATS user
	serviceAccount string // NAMESPACE/NAME of the agents
	audience       string
	account        string // where the agents' users are placed
}

func (c *calloutFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&c.issuerSeed, "auth-callout-issuer-seed", "",
		"answer the NATS servers' auth callout, signing node agents in by their pod's ServiceAccount token: the issuer's account seed ("+authcallout.IssuerFile+", toposched roles issue --auth-callout); every replica answers")
	fs.StringVar(&c.nkey, "auth-callout-nkey", "", "with --auth-callout-issuer-seed: the responder's own NATS seed (auth-callout.nk), a user of the callout account")
	fs.StringVar(&c.serviceAccount, "agent-service-account", "", "with --auth-callout-issuer-seed: NAMESPACE/NAME of the agents' ServiceAccount, the only one whose tokens sign in")
	fs.StringVar(&c.audience, "agent-token-audience", authcallout.DefaultAudience, "with --auth-callout-issuer-seed: the audience of the agents' tokens")
	fs.StringVar(&c.account, "auth-callout-account", "TOPOSCHED", "with --auth-callout-issuer-seed: the NATS account the agents are placed in (toposched roles conf --account)")
}

// startCallout starts the auth callout responder on its own connection
// (a user of the callout account, with the command's TLS), or nothing
// without --auth-callout-issuer-seed. stop ends it; nc is its connection
// (nil without).
func startCallout(g *globals, c *calloutFlags, f *kubeFlags, url string, log *slog.Logger) (nc *nats.Conn, stop func(), err error) {
	if c.issuerSeed == "" {
		if c.nkey != "" || c.serviceAccount != "" {
			return nil, nil, errors.New("--auth-callout-nkey, --agent-service-account: give --auth-callout-issuer-seed too")
		}
		return nil, func() {}, nil
	}
	sa, err := authcallout.ParseServiceAccount(c.serviceAccount)
	if err != nil {
		return nil, nil, fmt.Errorf("--agent-service-account: %w", err)
	}
	if c.nkey == "" {
		return nil, nil, errors.New("--auth-callout-nkey: the responder's NATS seed is required with --auth-callout-issuer-seed")
	}
	issuer, err := authcallout.ReadIssuer(c.issuerSeed)
	if err != nil {
		return nil, nil, fmt.Errorf("--auth-callout-issuer-seed: %w", err)
	}
	rc, err := f.restConfig()
	if err != nil {
		return nil, nil, err
	}
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client: %w", err)
	}
	r, err := authcallout.New(authcallout.Config{
		Issuer: issuer, Account: c.account, ServiceAccount: sa, Audience: c.audience,
		Role: roles{g.prefix}.agentRole, Kube: kc, Log: log.With("service", "auth-callout"),
	})
	if err != nil {
		return nil, nil, err
	}
	// Its own user, with the command's TLS: the callout account is not
	// toposched's.
	conn := natsflags.Flags{NKey: c.nkey, TLSCA: g.conn.TLSCA, TLSCert: g.conn.TLSCert, TLSKey: g.conn.TLSKey}
	opts, err := conn.Options()
	if err != nil {
		return nil, nil, fmt.Errorf("--auth-callout-nkey: %w", err)
	}
	opts = append(opts, nats.Name("toposched kube: auth callout"), nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("auth callout: disconnected from NATS", "err", err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info("auth callout: reconnected to NATS") }))
	nc, err = nats.Connect(url, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("auth callout: connect to %s as %s: %w", url, c.nkey, err)
	}
	stopListen, err := r.Listen(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, func() {
		stopListen()
		nc.Close()
	}, nil
}

func newKube(g *globals) *cobra.Command {
	var f kubeFlags
	var ops opsFlags
	var callout calloutFlags
	cmd := &cobra.Command{
		Use:   "kube",
		Short: "Run the Kubernetes service: schedule gangs of pods and allocate their GPUs through DRA",
		Long: `kube schedules the pods whose spec.schedulerName is toposched (--scheduler-name):
it groups them into gangs by their workload's labels (PodGroup, JobSet,
LeaderWorkerSet, Kubeflow), submits each complete gang as one job, and carries
placement's decision out: each pod's ResourceClaims get exactly the decided
GPUs, and every pod of the gang is bound with its rank environment in its
annotations. GPUs that other schedulers' claims hold, and those of cordoned,
not ready or tainted nodes, are published held so placement never gives them.

One replica acts at a time: the holder of the lease "kube" in the lease
bucket, as placement's replicas campaign for theirs.

With --auth-callout-issuer-seed every replica also answers the NATS servers'
auth callout (toposched roles conf --auth-callout-issuer): a node's agent that
signs in with its pod's ServiceAccount token (toposched agent --nats-token-file)
is let in as that node's agent, once the API server's TokenReview says the
token is the agents' ServiceAccount's (--agent-service-account), for the
audience, and bound to a pod on that node; anything else is refused.`,
		Example: `  toposched kube --nats-url nats://toposched-nats:4222 --kubeconfig in-cluster
  toposched kube --kubeconfig in-cluster --auth-callout-issuer-seed /etc/toposched/auth-callout/auth-callout-issuer.seed \
    --auth-callout-nkey /etc/toposched/auth-callout/auth-callout.nk --agent-service-account toposched/toposched-agent
  toposched serve --cluster cluster.yaml --kubeconfig ~/.kube/config`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			if err := ops.applyMemoryLimit(log); err != nil {
				return err
			}
			url := g.natsURLOrLocal()
			// The agents' sign-ins are answered on every replica, the
			// leader's and the standbys' alike, before the service starts.
			calloutConn, stopCallout, err := startCallout(g, &callout, &f, url, log)
			if err != nil {
				return err
			}
			defer stopCallout()
			run := &kubeRun{}
			return runLeased(cmd.Context(), g, &ops, url, leased{
				role:    roleKube,
				metrics: func(m *metrics.Metrics) { run.met = kube.NewMetrics(m.Registry()) },
				ready: func() error {
					if calloutConn != nil && !calloutConn.IsConnected() {
						return fmt.Errorf("auth callout: nats: %s", calloutConn.Status())
					}
					return run.ready()
				},
				run: func(ctx context.Context, b *bus.Bus) error { return runKube(ctx, b, &f, &ops, run, log) },
			}, log)
		},
	}
	f.register(cmd.Flags(), true)
	callout.register(cmd.Flags())
	cmd.Flags().StringVar(&ops.replica, "replica", os.Getenv("TOPOSCHED_REPLICA"),
		"this replica's name in the lease, unique among live replicas, such as the pod name (env TOPOSCHED_REPLICA; default host/pid)")
	cmd.Flags().DurationVar(&ops.leaseTTL, "lease-ttl", operator.DefaultLeaseTTL, "the lease bucket's TTL: the same as placement's --lease-ttl")
	cmd.Flags().StringVar(&ops.memoryLimit, "memory-limit", "", "the Go runtime's soft memory limit (0: none; default GOMEMLIMIT, else 1GiB)")
	cmd.Flags().StringVar(&ops.metricsListen, "metrics-listen", "", "serve /metrics (Prometheus), /healthz and /readyz on HOST:PORT (empty: off)")
	return cmd
}
