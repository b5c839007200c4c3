// Command bundle-validate checks an OLM bundle directory (manifests/ and
// metadata/) the way `operator-sdk bundle validate DIR` does, with the
// operator-framework libraries themselves, and exits 1 when anything is an
// error, so `make test` can rely on its exit code (operator-verify, the api
// module's own command, logs errors but exits 0).
//
// Each finding is one line, tagged with the check that made it:
//
//	format   operator-registry: layout, metadata/annotations.yaml, media type
//	content  operator-registry: every manifest decodes, kinds registry+v1 allows
//	api      operator-framework/api DefaultBundleValidators (CSV, CRDs, bundle)
//	install  what OLM relies on when it installs the CSV's webhooks and
//	         deployments, which none of the above look at: a webhook definition
//	         names a deployment of the install strategy (or OLM never creates
//	         it), a port of that deployment, a known type, a unique name, and
//	         rules that leave OLM's own API group alone; every deployment runs
//	         under an account the permissions create.
//	upgrade  what OLM's resolver reads to replace an installed CSV: the
//	         olm.skipRange annotation parses as OLM parses it (blang/semver)
//	         and does not include the CSV's own version.
//
// Usage: bundle-validate DIR
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/blang/semver/v4"
	apimanifests "github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/operators/v1alpha1"
	"github.com/operator-framework/api/pkg/validation"
	registrybundle "github.com/operator-framework/operator-registry/pkg/lib/bundle"
	"github.com/sirupsen/logrus"
)

type report struct{ errors, warnings int }

func (r *report) errorf(check, format string, args ...any) {
	r.errors++
	fmt.Printf("ERROR %s: %s\n", check, fmt.Sprintf(format, args...))
}

func (r *report) warnf(check, format string, args ...any) {
	r.warnings++
	fmt.Printf("WARN %s: %s\n", check, fmt.Sprintf(format, args...))
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: bundle-validate DIR")
		os.Exit(2)
	}
	dir := os.Args[1]
	r := &report{}

	logger := logrus.New()
	logger.SetOutput(os.Stderr)
	logger.SetLevel(logrus.WarnLevel)
	registry := registrybundle.NewImageValidator(nil, logrus.NewEntry(logger))
	if err := registry.ValidateBundleFormat(dir); err != nil {
		r.errorf("format", "%v", err)
	}
	if err := registry.ValidateBundleContent(filepath.Join(dir, registrybundle.ManifestsDir)); err != nil {
		r.errorf("content", "%v", err)
	}

	bundle, err := apimanifests.GetBundleFromDir(dir)
	if err != nil || bundle == nil || bundle.CSV == nil {
		r.errorf("api", "cannot read a bundle with a ClusterServiceVersion from %s: %v", dir, err)
	} else {
		for _, res := range validation.DefaultBundleValidators.Validate(bundle.ObjectsToValidate()...) {
			for _, e := range res.Errors {
				r.errorf("api", "%s", e.Error())
			}
			for _, w := range res.Warnings {
				r.warnf("api", "%s", w.Error())
			}
		}
		checkInstall(r, bundle.CSV)
		checkUpgrade(r, bundle.CSV)
	}

	fmt.Printf("bundle-validate: %s: %d errors, %d warnings\n", dir, r.errors, r.warnings)
	if r.errors > 0 {
		os.Exit(1)
	}
}

func checkInstall(r *report, csv *v1alpha1.ClusterServiceVersion) {
	spec := csv.Spec.InstallStrategy.StrategySpec
	accounts := map[string]bool{}
	for _, p := range append(append([]v1alpha1.StrategyDeploymentPermissions{}, spec.Permissions...), spec.ClusterPermissions...) {
		accounts[p.ServiceAccountName] = true
	}
	ports := map[string]map[int32]bool{}
	for _, d := range spec.DeploymentSpecs {
		ports[d.Name] = map[int32]bool{}
		for _, c := range d.Spec.Template.Spec.Containers {
			for _, p := range c.Ports {
				ports[d.Name][p.ContainerPort] = true
			}
		}
		if sa := d.Spec.Template.Spec.ServiceAccountName; !accounts[sa] {
			r.errorf("install", "deployment %s runs as %q, which no permissions entry creates", d.Name, sa)
		}
	}

	seen := map[string]bool{}
	for i, w := range csv.Spec.WebhookDefinitions {
		where := fmt.Sprintf("spec.webhookdefinitions[%d] (%s)", i, w.GenerateName)
		if seen[w.GenerateName] {
			r.errorf("install", "%s: generateName repeated; OLM fails the CSV", where)
		}
		seen[w.GenerateName] = true
		switch w.Type {
		case v1alpha1.ValidatingAdmissionWebhook, v1alpha1.MutatingAdmissionWebhook, v1alpha1.ConversionWebhook:
		default:
			r.errorf("install", "%s: type %q is none of ValidatingAdmissionWebhook, MutatingAdmissionWebhook, ConversionWebhook", where, w.Type)
		}
		if w.DeploymentName == "" {
			r.errorf("install", "%s: no deploymentName; OLM would serve it from no deployment", where)
		} else if _, ok := ports[w.DeploymentName]; !ok {
			r.errorf("install", "%s: deploymentName %q is not a deployment of the install strategy", where, w.DeploymentName)
		} else {
			target := w.ContainerPort
			if w.TargetPort != nil {
				target = w.TargetPort.IntVal
			}
			if !ports[w.DeploymentName][target] {
				r.errorf("install", "%s: deployment %s has no container port %d", where, w.DeploymentName, target)
			}
		}
		if w.Type != v1alpha1.ConversionWebhook && (w.WebhookPath == nil || *w.WebhookPath == "") {
			r.errorf("install", "%s: no webhookPath", where)
		}
		for _, rule := range w.Rules {
			for _, g := range rule.APIGroups {
				if g == "*" || g == "operators.coreos.com" {
					r.errorf("install", "%s: rules name API group %q, which OLM refuses", where, g)
				}
			}
		}
	}
}

func checkUpgrade(r *report, csv *v1alpha1.ClusterServiceVersion) {
	skip, ok := csv.GetAnnotations()["olm.skipRange"]
	if !ok {
		return
	}
	inRange, err := semver.ParseRange(skip)
	if err != nil {
		r.errorf("upgrade", "olm.skipRange %q: %v; OLM ignores the range", skip, err)
		return
	}
	if inRange(csv.Spec.Version.Version) {
		r.errorf("upgrade", "olm.skipRange %q includes the CSV's own version %s", skip, csv.Spec.Version.String())
	}
}
