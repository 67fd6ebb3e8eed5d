package kube

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestEachPod: every plan is tried, no more than carryOutParallelism at
// once, and the error is the first failed plan's in the gang's order, as a
// loop over the plans would have returned it.
func TestEachPod(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pods   int
		failAt map[int]error
		want   int // index whose error is returned, -1 for none
	}{
		{"none fails", 3, nil, -1},
		{"one fails", 4, map[int]error{2: errors.New("two")}, 2},
		{"the earliest of several", 5, map[int]error{4: errors.New("four"), 1: &permanentError{errors.New("one")}, 3: errors.New("three")}, 1},
		{"more pods than run at once", 3*carryOutParallelism + 1, map[int]error{3 * carryOutParallelism: errors.New("last")}, 3 * carryOutParallelism},
		{"no pods", 0, nil, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pls := make([]podPlan, tc.pods)
			for i := range pls {
				pls[i] = podPlan{pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint(i)}}, index: i}
			}
			var mu sync.Mutex
			tried := map[int]bool{}
			running, most := 0, 0
			err := eachPod(pls, func(pl podPlan) error {
				mu.Lock()
				tried[pl.index] = true
				running++
				most = max(most, running)
				mu.Unlock()
				defer func() {
					mu.Lock()
					running--
					mu.Unlock()
				}()
				return tc.failAt[pl.index]
			})
			if len(tried) != tc.pods {
				t.Errorf("%d of %d plans tried", len(tried), tc.pods)
			}
			if most > carryOutParallelism {
				t.Errorf("%d plans ran at once, more than %d", most, carryOutParallelism)
			}
			switch {
			case tc.want < 0 && err != nil:
				t.Errorf("error %v, want none", err)
			case tc.want >= 0 && !errors.Is(err, tc.failAt[tc.want]):
				t.Errorf("error %v, want plan %d's %v", err, tc.want, tc.failAt[tc.want])
			}
		})
	}
}
