package bench

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// KernelRun is one kernel's run of a scenario: on this machine's kernel
// (Accel "native") or in a VM.
type KernelRun struct {
	Release string // uname -r of the kernel it ran on
	Accel   string // native, kvm or tcg
	Run     *Run
}

// Label names the kernel as a column: release and accelerator, so that
// the same kernel natively and in a VM are two columns.
func (k KernelRun) Label() string { return k.Release + " " + k.Accel }

// perKernel are the parameters a VM run records about its own kernel;
// a merged run keeps them per kernel.
var perKernel = []string{"kernel", "accel", "vm", "kernel_image", "kernel_cmdline"}

// MergeKernels joins runs of one scenario on several kernels into one run
// whose samples carry a "kernel" configuration key (first in the display
// order, so tables and plots have kernels as columns). Notes and skips
// say which kernel they are of; the parameters name every kernel with
// its accelerator; env is where the merge happens (this machine).
// Where one release ran both natively and in a VM, a note states the
// VM's overhead on the scenario's first metric.
func MergeKernels(parts []KernelRun, env Env) *Run {
	m := &Run{ID: NewID(), Env: env, Params: map[string]string{}}
	var labels, accels []string
	for i, p := range parts {
		r, label := p.Run, p.Label()
		labels = append(labels, label)
		if !slices.Contains(accels, p.Accel) {
			accels = append(accels, p.Accel)
		}
		if i == 0 {
			m.Scenario, m.Started, m.Keys = r.Scenario, r.Started, append([]string{"kernel"}, r.Keys...)
			for k, v := range r.Params {
				if !slices.Contains(perKernel, k) {
					m.Params[k] = v
				}
			}
		}
		m.Elapsed += r.Elapsed
		var about []string
		for _, k := range perKernel[2:] {
			if v := r.Params[k]; v != "" {
				about = append(about, k+"="+v)
			}
		}
		m.Params["kernel "+label] = strings.Join(append([]string{"accel=" + p.Accel}, about...), " ")
		for _, x := range r.Samples {
			cfg := map[string]string{"kernel": label}
			for k, v := range x.Config {
				cfg[k] = v
			}
			x.Config = cfg
			m.Samples = append(m.Samples, x)
		}
		for _, n := range r.Notes {
			m.Notes = append(m.Notes, "["+label+"] "+n)
		}
		for _, s := range r.Skipped {
			m.Skipped = append(m.Skipped, "kernel="+label+"/"+s)
		}
	}
	m.Params["kernels"] = strings.Join(labels, ", ")
	m.Params["accel"] = strings.Join(accels, "+")
	m.Notes = append(m.Notes, vmOverhead(parts)...)
	return m
}

// vmOverhead compares, for every release that ran natively and in a VM,
// the mean of the first metric over the configurations both ran.
func vmOverhead(parts []KernelRun) []string {
	var notes []string
	for _, nat := range parts {
		if nat.Accel != "native" || len(nat.Run.Samples) == 0 {
			continue
		}
		metric := nat.Run.Samples[0].Metric
		for _, vm := range parts {
			if vm.Accel == "native" || vm.Release != nat.Release {
				continue
			}
			a, b := meanOf(nat.Run, metric), meanOf(vm.Run, metric)
			var ratios []float64
			var configs []string
			for cfg, na := range a {
				if vb, ok := b[cfg]; ok && na > 0 {
					ratios = append(ratios, vb/na)
					configs = append(configs, cfg)
				}
			}
			if len(ratios) == 0 {
				continue
			}
			sort.Float64s(ratios)
			notes = append(notes, fmt.Sprintf("VM overhead: kernel %s under %s gives %.2fx its native %s (median over %d configurations, %.2fx to %.2fx); "+
				"this is the VM's cost on this machine, to discount from the other VM kernels' columns",
				nat.Release, vm.Accel, ratios[len(ratios)/2], metric, len(ratios), ratios[0], ratios[len(ratios)-1]))
		}
	}
	return notes
}

// meanOf is the mean of metric per configuration (over marks and reps).
func meanOf(r *Run, metric string) map[string]float64 {
	sum, n := map[string]float64{}, map[string]int{}
	for _, x := range r.Samples {
		if x.Metric == metric {
			k := ConfigKey(x.Config, r.Keys)
			sum[k] += x.Value
			n[k]++
		}
	}
	for k := range sum {
		sum[k] /= float64(n[k])
	}
	return sum
}
